"""tests/runtime."""
