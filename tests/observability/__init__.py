"""tests/observability."""
