"""tests/client."""
