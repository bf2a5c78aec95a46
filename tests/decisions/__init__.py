"""tests/decisions."""
