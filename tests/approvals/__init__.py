"""tests/approvals."""
