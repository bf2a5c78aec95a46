"""tests/auth."""
