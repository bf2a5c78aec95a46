"""tests/api."""
