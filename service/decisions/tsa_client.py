"""One RFC 3161 timestamp query (https://www.rfc-editor.org/rfc/rfc3161), posted over HTTP.

The query (built by Trail of Bits' `rfc3161-client`, no hand-written ASN.1) asks for a
timestamp over SHA-256 of the text, with a fresh nonce and certReq true (the reply
carries the TSA's certificate, so `openssl ts -verify -CAfile` needs only the CA). It
is POSTed as `application/timestamp-query`; the reply is kept only when it parses, its
status is granted, its message imprint is our digest (`store.chain.timestamp_store.
covered`), its nonce is ours, and, with `SESSIONSTATE_TSA_CA_FILE`, its signature
verifies and its signer chains to those CAs with the timeStamping key usage.
What the answer means is `Answer`; its body is never logged. Short timeouts: a query
runs on the background job, never on a request.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import httpx
from rfc3161_client import (
    HashAlgorithm,
    TimeStampRequest,
    TimestampRequestBuilder,
    TimeStampResponse,
    VerificationError,
    VerifierBuilder,
)

from service.config.timestamp_authority import TimestampAuthority
from store.chain.timestamp_store import TimestampRejected, covered

QUERY_MEDIA_TYPE = "application/timestamp-query"
REPLY_MEDIA_TYPE = "application/timestamp-reply"
TIMEOUT = httpx.Timeout(10.0, connect=2.0)
_MAX_REPLY_BYTES = 256 * 1024


@dataclass(frozen=True)
class Stamped:
    """A reply that timestamps the text: its DER bytes, as the TSA answered them."""

    reply: bytes


@dataclass(frozen=True)
class Rejected:
    """A 4xx, or a reply that is not a timestamp of the text: `why` says which check."""

    why: str


@dataclass(frozen=True)
class Unreachable:
    """No answer (connection, timeout) or a 5xx."""

    error_type: str


Answer = Stamped | Rejected | Unreachable


def timestamp_query(text: bytes) -> TimeStampRequest:
    """A query for SHA-256(`text`), with a nonce, asking for the TSA's certificate."""
    builder = TimestampRequestBuilder().data(text).hash_algorithm(HashAlgorithm.SHA256)
    return builder.nonce(nonce=True).cert_request(cert_request=True).build()


def request_timestamp(client: httpx.Client, authority: TimestampAuthority, text: bytes) -> Answer:
    """Ask the TSA for a timestamp of `text`; what came back, checked."""
    query = timestamp_query(text)
    headers = {"Content-Type": QUERY_MEDIA_TYPE}
    try:
        response = client.post(
            authority.url, content=query.as_bytes(), headers=headers, timeout=TIMEOUT
        )
    except httpx.HTTPError as error:
        return Unreachable(type(error).__name__)
    if response.status_code >= 500:
        return Unreachable(f"http_{response.status_code}")
    if response.status_code != 200:
        return Rejected(f"http_{response.status_code}")
    if len(response.content) > _MAX_REPLY_BYTES:
        return Rejected("reply_too_large")
    try:
        checked(query, response.content, text, authority)
    except TimestampRejected as error:
        return Rejected(error.why)
    return Stamped(response.content)


def checked(
    query: TimeStampRequest, reply: bytes, text: bytes, authority: TimestampAuthority
) -> TimeStampResponse:
    """The reply, when it answers `query` over `text`; else `TimestampRejected`."""
    parsed = covered(reply, text)
    if parsed.tst_info.nonce != query.nonce:
        raise TimestampRejected("nonce_mismatch")
    if authority.roots:
        verifier = VerifierBuilder.from_request(query)
        for root in authority.roots:
            verifier = verifier.add_root_certificate(root)
        try:
            verifier.build().verify(parsed, hashlib.sha256(text).digest())
        except VerificationError:
            raise TimestampRejected("signature_invalid") from None
    return parsed
