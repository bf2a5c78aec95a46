"""tests/service."""
