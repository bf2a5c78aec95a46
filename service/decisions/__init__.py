"""The decision log: what an entry holds, the journal that commits it, offline review."""
