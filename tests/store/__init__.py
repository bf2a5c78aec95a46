"""tests/store."""
