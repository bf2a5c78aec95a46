"""tests/config."""
