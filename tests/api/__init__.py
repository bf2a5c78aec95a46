"""Tests of `service.api`: the v1 contract's constants, reason codes, OpenAPI document and
docs/api.md."""
