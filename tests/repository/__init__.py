"""tests/repository."""
