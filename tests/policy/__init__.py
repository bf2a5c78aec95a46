"""tests/policy."""
