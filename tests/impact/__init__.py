"""tests/impact."""
