"""Tests of `service.auth`: bearer tokens, an identity provider's JWKS and the token exchange."""
