"""SESSIONSTATE_TSA_URL and SESSIONSTATE_TSA_CA_FILE: what parses, and each value that does
not is a configuration error naming the variable, never repeating the value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.config.configuration_error import ConfigurationError
from service.config.values import Configuration
from tests.support.live import service_settings
from tests.support.tsa import make_authority

CANARY = "canary-7f3a"


def configured(tmp_path: Path, **settings: Any) -> Configuration:
    return Configuration.read(service_settings(tmp_path / "var", **settings))


def test_the_url_and_the_ca_file_parse(tmp_path: Path) -> None:
    assert configured(tmp_path).timestamp_authority is None
    bare = configured(tmp_path, tsa_url="https://tsa.example/tsr").timestamp_authority
    assert bare is not None and (bare.url, bare.roots) == ("https://tsa.example/tsr", ())
    ca, _ = make_authority(tmp_path / "tsa")
    checked = configured(tmp_path, tsa_url="http://127.0.0.1:8318/", tsa_ca_file=ca)
    authority = checked.timestamp_authority
    assert authority is not None and len(authority.roots) == 1
    assert "8318" not in repr(checked.settings)  # the URL is never echoed


@pytest.mark.parametrize(
    ("url", "ca", "says"),
    [
        (f"ftp://{CANARY}.example/", None, "SESSIONSTATE_TSA_URL must be http(s)://host"),
        (f"http://user:{CANARY}@tsa.example/", None, "SESSIONSTATE_TSA_URL must be"),
        (f"https://tsa.example/?key={CANARY}", None, "SESSIONSTATE_TSA_URL must be"),
        (f"{CANARY}", None, "SESSIONSTATE_TSA_URL must be"),
        ("http://tsa.example:port/", None, "SESSIONSTATE_TSA_URL must be"),
        (None, "ca.pem", "SESSIONSTATE_TSA_CA_FILE is set without SESSIONSTATE_TSA_URL"),
        ("http://tsa.example/", "missing.pem", "SESSIONSTATE_TSA_CA_FILE cannot be read"),
        ("http://tsa.example/", "not-pem", "SESSIONSTATE_TSA_CA_FILE must hold PEM X.509"),
    ],
)
def test_a_value_that_does_not_hold_is_named_never_repeated(
    tmp_path: Path, url: str | None, ca: str | None, says: str
) -> None:
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "not-pem").write_text(f"{CANARY}\n")
    ca_file = None if ca is None else tmp_path / ca
    with pytest.raises(ConfigurationError) as refused:
        configured(tmp_path, tsa_url=url, tsa_ca_file=ca_file)
    assert str(refused.value).startswith(says)
    assert CANARY not in str(refused.value)
