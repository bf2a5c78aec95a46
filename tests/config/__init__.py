"""Tests of `service.config`: settings refused by name, and the secrets."""
