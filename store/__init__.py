"""The store: the sanitized records, the decision chains and the lane stores they live in. It
imports nothing of the service."""
