"""`ConfigurationError`: a setting that cannot work, named by its variable.

It lives apart from the wiring (`service.context`) so that any module which checks a
setting (tracing, the policy engine's checks, the CLI) can raise it without importing
what the wiring imports.
"""

from __future__ import annotations


class ConfigurationError(ValueError):
    """A setting that cannot work; the message names the variable, never its value."""
