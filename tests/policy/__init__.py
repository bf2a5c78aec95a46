"""Tests of `service.policy` and `policies/`: the engine, reloads, admission, invariants,
signed bundles, activation and shadow policies."""
