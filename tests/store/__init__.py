"""Tests of `store`: the record, the key codec, both lane-store backends and LevelDB's
corruption and repair."""
