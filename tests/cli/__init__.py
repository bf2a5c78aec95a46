"""Tests of `service.cli`: the `sessionstate` command and the walk-through `make run` prints."""
