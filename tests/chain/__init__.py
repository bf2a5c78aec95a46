"""tests/chain."""
