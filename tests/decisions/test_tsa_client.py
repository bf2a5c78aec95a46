"""One RFC 3161 query to OpenSSL's own TSA (`openssl ts -reply` behind tests/support/tsa.py)
over real HTTP: a reply that timestamps the text is kept as answered, and `openssl ts
-verify` accepts it; a reply over other text, under another CA, with another nonce, or
garbage, a 500 or no answer is not."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from service.config.timestamp_authority import TimestampAuthority
from service.decisions.tsa_client import (
    Rejected,
    Stamped,
    Unreachable,
    checked,
    request_timestamp,
    timestamp_query,
)
from store.chain.timestamp_store import TimestampRejected, covered
from tests.support.tsa import Tsa, make_authority, openssl_tsa

TEXT = b"log.test/tenant-a\n3\nX6hsQ3ZkbjpVYHo2Zm1mb2V5c3ZtcWh0c3N3b2x3bm8=\n"


@pytest.fixture(scope="module")
def tsa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tsa]:
    with openssl_tsa(tmp_path_factory.mktemp("tsa")) as running:
        yield running


def roots(path: Path) -> tuple[x509.Certificate, ...]:
    return tuple(x509.load_pem_x509_certificates(path.read_bytes()))


def openssl_verifies(data: Path, reply: Path, ca: Path) -> bool:
    done = subprocess.run(
        ["openssl", "ts", "-verify", "-data", data, "-in", reply, "-CAfile", ca],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ("Verification: OK" in done.stdout) == (done.returncode == 0), done
    return done.returncode == 0


def test_a_granted_reply_is_kept_as_answered_and_openssl_verifies_it(
    tsa: Tsa, tmp_path: Path
) -> None:
    tsa.mode = "ok"
    with httpx.Client() as client:
        answer = request_timestamp(client, TimestampAuthority(tsa.url, roots(tsa.ca)), TEXT)
    assert isinstance(answer, Stamped)
    (tmp_path / "text").write_bytes(TEXT)
    (tmp_path / "reply.tsr").write_bytes(answer.reply)
    assert openssl_verifies(tmp_path / "text", tmp_path / "reply.tsr", tsa.ca)
    (tmp_path / "text").write_bytes(TEXT.replace(b"\n3\n", b"\n4\n"))
    assert not openssl_verifies(tmp_path / "text", tmp_path / "reply.tsr", tsa.ca)
    with pytest.raises(TimestampRejected, match="imprint_mismatch"):
        covered(answer.reply, TEXT + b"x")


def test_a_reply_under_another_ca_or_for_another_query_is_rejected(
    tsa: Tsa, tmp_path: Path
) -> None:
    tsa.mode = "ok"
    other_ca, _ = make_authority(tmp_path / "other")
    with httpx.Client() as client:
        answer = request_timestamp(client, TimestampAuthority(tsa.url, roots(other_ca)), TEXT)
        assert answer == Rejected("signature_invalid")
        unchecked = request_timestamp(client, TimestampAuthority(tsa.url), TEXT)
    assert isinstance(unchecked, Stamped)  # without a CA file: status, digest, nonce
    with pytest.raises(TimestampRejected, match="nonce_mismatch"):
        checked(timestamp_query(TEXT), unchecked.reply, TEXT, TimestampAuthority(tsa.url))


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("garbage", Rejected("reply_unreadable")), ("error", Unreachable("http_500"))],
)
def test_garbage_and_a_500_keep_nothing(tsa: Tsa, mode: str, expected: object) -> None:
    tsa.mode = mode  # type: ignore[assignment]
    with httpx.Client() as client:
        assert request_timestamp(client, TimestampAuthority(tsa.url), TEXT) == expected
    tsa.mode = "ok"


def test_a_tsa_that_does_not_answer_is_unreachable(tmp_path: Path) -> None:
    with openssl_tsa(tmp_path / "gone") as gone:
        url = gone.url
    with httpx.Client() as client:
        answer = request_timestamp(client, TimestampAuthority(url), TEXT)
    assert answer == Unreachable("ConnectError")
