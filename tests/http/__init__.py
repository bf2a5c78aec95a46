"""tests/http."""
