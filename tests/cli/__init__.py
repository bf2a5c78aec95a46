"""tests/cli."""
