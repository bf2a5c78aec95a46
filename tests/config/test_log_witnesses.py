"""SESSIONSTATE_LOG_WITNESSES and SESSIONSTATE_LOG_WITNESS_QUORUM: what parses, and each value
that does not is a configuration error naming the variable, never repeating the value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from service.config.configuration_error import ConfigurationError
from service.config.values import Configuration
from store.chain.cosignature import COSIGNATURE_V1
from store.chain.note import NoteSigner, VerifierKey, key_id
from tests.support.live import service_settings

CANARY = "canary-7f3a"


def witness_vkey(name: str) -> str:
    """A tlog-cosignature v1 verifier key (type 0x04), as a witness prints its own."""
    public = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return str(VerifierKey(name, key_id(name, COSIGNATURE_V1, public), COSIGNATURE_V1, public))


def configured(tmp_path: Path, witnesses: Any, quorum: int | None = None) -> Configuration:
    raw = witnesses if isinstance(witnesses, str) else json.dumps(witnesses)
    settings = service_settings(tmp_path, log_witnesses=raw, log_witness_quorum=quorum)
    return Configuration.read(settings)


def test_witnesses_and_the_quorum_parse(tmp_path: Path) -> None:
    listed = [
        {"vkey": witness_vkey("w.example/1"), "url": "https://w1.example/witness/"},
        {"vkey": witness_vkey("w.example/2"), "url": "http://127.0.0.1:7380"},
    ]
    witnesses = configured(tmp_path, listed).witnesses
    assert [w.name for w in witnesses.witnesses] == ["w.example/1", "w.example/2"]
    assert witnesses.quorum == 2  # every witness, by default
    assert witnesses.witnesses[0].add_checkpoint_url == "https://w1.example/witness/add-checkpoint"
    assert configured(tmp_path, listed, quorum=1).witnesses.quorum == 1
    none = Configuration.read(service_settings(tmp_path)).witnesses
    assert not none and none.witnesses == ()


LOG_KEY = str(NoteSigner("log.example", Ed25519PrivateKey.generate()).verifier_key)
GOOD = witness_vkey("w.example/1")


@pytest.mark.parametrize(
    ("witnesses", "quorum", "says"),
    [
        (f"not json {CANARY}", None, "must be a JSON array"),
        ({"vkey": GOOD, "url": "http://w.example"}, None, "must be a JSON array"),
        ([{"vkey": GOOD}], None, "must be a JSON array"),
        ([{"vkey": GOOD, "url": "http://w.example", CANARY: 1}], None, "must be a JSON array"),
        ([{"vkey": CANARY, "url": "http://w.example"}], None, "witness 1: its vkey"),
        ([{"vkey": LOG_KEY, "url": "http://w.example"}], None, "of type 0x04"),
        ([{"vkey": GOOD, "url": f"ftp://{CANARY}"}], None, "witness 1: its url"),
        ([{"vkey": GOOD, "url": f"{CANARY}"}], None, "witness 1: its url"),
        ([{"vkey": GOOD, "url": f"http://w.example/?{CANARY}"}], None, "its url"),
        ([{"vkey": GOOD, "url": "http://w.example:port"}], None, "its url"),
        ([{"vkey": GOOD, "url": "http://a"}, {"vkey": GOOD, "url": "http://b"}], None, "twice"),
        ([{"vkey": GOOD, "url": "http://w.example"}], 2, "SESSIONSTATE_LOG_WITNESS_QUORUM"),
        ([], 1, "SESSIONSTATE_LOG_WITNESS_QUORUM"),
    ],
)
def test_a_value_that_does_not_hold_is_named_never_repeated(
    tmp_path: Path, witnesses: Any, quorum: int | None, says: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        configured(tmp_path, witnesses, quorum)
    message = str(raised.value)
    assert "SESSIONSTATE_LOG_WITNESS" in message and says in message
    assert CANARY not in message and GOOD not in message
