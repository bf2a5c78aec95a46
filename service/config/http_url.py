"""Whether a setting's URL is one the service posts to: `http(s)://host[:port][/path]`.

The witnesses' URLs (`SESSIONSTATE_LOG_WITNESSES`) and the time-stamping authority's
(`SESSIONSTATE_TSA_URL`) are checked by it at start: no query, fragment or user (a
credential in a URL would end up in logs), and a port that is a number.
"""

from __future__ import annotations

from urllib.parse import urlsplit


def is_http_url(url: str) -> bool:
    """Whether `url` is http(s)://host[:port][/path], without query, fragment or user."""
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        ok = ok and not (parts.query or parts.fragment or parts.username or parts.password)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number
    except ValueError:
        return False
    return ok
