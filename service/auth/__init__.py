"""Who a request is: the bearer tokens the service verifies (its own HS256 secret, an RS256
key file, an identity provider's JWKS), the session tokens it signs, and the token exchange
(`POST /v1/token`) that issues them."""
