"""`SESSIONSTATE_TSA_URL` and `SESSIONSTATE_TSA_CA_FILE`, parsed: the RFC 3161
time-stamping authority the checkpoint notes are timestamped by, and the CA
certificates its replies must chain to.

The URL must be http(s)://host[:port][/path] (`service.config.http_url`); the CA file,
when set, a readable PEM file of one or more X.509 certificates, and only beside a URL.
Without it the job checks each reply's status, digest and nonce but not its signature
(a reviewer's `openssl ts -verify -CAfile` does). A value that does not hold is a
`ConfigurationError` naming the variable, never the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from service.config.configuration_error import ConfigurationError
from service.config.http_url import is_http_url
from service.config.settings import Settings

URL = "SESSIONSTATE_TSA_URL"
CA_FILE = "SESSIONSTATE_TSA_CA_FILE"


@dataclass(frozen=True)
class TimestampAuthority:
    """Where timestamp queries are posted, and the roots a reply's signer must chain to
    (empty: the signature is not verified by the service)."""

    url: str
    roots: tuple[x509.Certificate, ...] = ()


def timestamp_authority(settings: Settings) -> TimestampAuthority | None:
    """The TSA the settings name (None: unset); `ConfigurationError` when it does not hold."""
    if settings.tsa_url is None:
        if settings.tsa_ca_file is not None:
            raise ConfigurationError(f"{CA_FILE} is set without {URL}")
        return None
    if not is_http_url(settings.tsa_url):
        raise ConfigurationError(
            f"{URL} must be http(s)://host[:port][/path], without query or user"
        )
    path = settings.tsa_ca_file
    return TimestampAuthority(settings.tsa_url, () if path is None else _roots(path))


def _roots(path: Path) -> tuple[x509.Certificate, ...]:
    try:
        pem = path.read_bytes()
    except OSError:
        raise ConfigurationError(f"{CA_FILE} cannot be read") from None
    try:
        return tuple(x509.load_pem_x509_certificates(pem))
    except ValueError:
        raise ConfigurationError(f"{CA_FILE} must hold PEM X.509 certificates") from None
