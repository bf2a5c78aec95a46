"""The digests and plans the client computes itself, against known vectors.

`DigestKey.digest_text` is HMAC-SHA256, so RFC 4231's test cases fix its
output; the key id derived from a secret is pinned here as a regression
vector (the server's suite holds it to the service's own derivation).
`canonical_digest` hashes RFC 8785 canonical JSON, spelled out by hand below,
and `plan_replay` builds the replay inputs of a record in the service's order.
"""

from __future__ import annotations

import hashlib

import pytest
from conftest import sanitized, template
from sessionstate_client import DigestKey, estimate_tokens
from sessionstate_client.models import SessionStateRecord
from sessionstate_client.replay import MAX_REPLAY_INPUTS, canonical_digest, plan_replay

RFC4231_KEY = b"\xaa" * 131


@pytest.mark.parametrize(
    ("secret", "text", "mac"),
    [
        pytest.param(
            b"\x0b" * 20,
            "Hi There",
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
            id="rfc4231-case-1",
        ),
        pytest.param(
            RFC4231_KEY,
            "Test Using Larger Than Block-Size Key - Hash Key First",
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            id="rfc4231-case-6",
        ),
        pytest.param(
            RFC4231_KEY,
            "This is a test using a larger than block-size key and a larger than block-size"
            " data. The key needs to be hashed before being used by the HMAC algorithm.",
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
            id="rfc4231-case-7",
        ),
    ],
)
def test_a_text_digest_is_hmac_sha256_under_the_key(secret: bytes, text: str, mac: str) -> None:
    assert DigestKey(secret, key_id="rfc4231").digest_text(text) == f"hmac-sha256:rfc4231:{mac}"


def test_a_key_id_is_derived_from_the_secret_when_none_is_given() -> None:
    key = DigestKey(b"\x0b" * 20)
    assert key.key_id == "k9e8da090ad08d18"
    assert key.digest_text("Hi There").startswith("hmac-sha256:k9e8da090ad08d18:b0344c61")
    assert DigestKey(b"\x0c" * 20).key_id != key.key_id  # another secret, another id


def test_the_secret_is_never_shown() -> None:
    key = DigestKey(b"super-secret-bytes-0123", key_id="svc")
    assert "super-secret" not in repr(key) and "svc" in repr(key)


@pytest.mark.parametrize(
    ("secret", "key_id", "message"),
    [
        (b"x" * 15, "svc", "at least 16 bytes"),
        (b"x" * 16, "has space", "must match"),
        (b"x" * 16, "k" * 33, "must match"),
        (b"x" * 16, "dots.are.out", "must match"),
    ],
)
def test_a_key_too_short_or_wrongly_named_is_refused(
    secret: bytes, key_id: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        DigestKey(secret, key_id=key_id)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("é", 1), ("日本語", 3), ("🙂🙂", 2)],
)
def test_tokens_are_estimated_as_four_utf8_bytes_each(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


def test_a_lone_surrogate_is_digested_not_refused() -> None:
    key = DigestKey(b"x" * 16, key_id="svc")
    assert key.digest_text("\ud800").startswith("hmac-sha256:svc:")
    assert estimate_tokens("\ud800") == 1


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        ({}, b"{}"),
        ([], b"[]"),
        ({"b": 1, "a": [True, None, "x"]}, b'{"a":[true,null,"x"],"b":1}'),
        ({"name": "Grüße"}, '{"name":"Grüße"}'.encode()),
        ({"n": -(2**53 - 1)}, b'{"n":-9007199254740991}'),
        ({"quote": 'say "hi"\n'}, b'{"quote":"say \\"hi\\"\\n"}'),
    ],
)
def test_canonical_digest_hashes_the_canonical_json(value: object, canonical: bytes) -> None:
    assert canonical_digest(value) == "sha256:" + hashlib.sha256(canonical).hexdigest()


def test_canonical_digest_of_an_empty_object_is_the_known_hash() -> None:
    expected = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    assert canonical_digest({}) == expected


@pytest.mark.parametrize(
    "value",
    [1.5, 2**53, {"é": 1}, {1: "x"}, (1, 2), {"a": {"b": [0.1]}}, b"bytes"],
)
def test_canonical_digest_refuses_what_its_encoding_does_not_cover(value: object) -> None:
    with pytest.raises(ValueError, match="canonical encoding"):
        canonical_digest(value)


def record() -> SessionStateRecord:
    turns = [
        {"turn_id": "t1", "role": "user", "payload": "abcdefgh"},
        {"turn_id": "t2", "role": "assistant", "payload": "abcd"},
    ]
    extra = [{"anchor_id": "doc:second", "evidence": "more"}]
    state = template(turns=turns, retrieval_evidence=template()["retrieval_evidence"] + extra)
    return SessionStateRecord.model_validate(sanitized(state))


def test_a_replay_plan_lists_the_records_inputs_in_the_services_order() -> None:
    plan = plan_replay(record(), 16)
    assert [i.anchor_id for i in plan.retrieval_inputs] == [
        "memory:active",
        "doc:borrowck",
        "doc:second",
    ]
    assert [i.kind for i in plan.routing_inputs] == ["runtime_profile", "routing"]
    assert [i.anchor_id for i in plan.gene_inputs] == ["gene:rust"]
    profile = plan.routing_inputs[0]
    assert profile.anchor_id == "runtime_profile" and profile.profile is not None
    assert profile.evidence_digest == canonical_digest(
        record().runtime_profile.model_dump(mode="json")
    )
    assert plan.allowed is True and plan.blocked_reasons == []
    assert plan.history is not None
    assert (plan.history.kept_turns, plan.history.kept_token_estimate) == (2, 3)
    assert plan.history.compacted_turns == 0


def test_a_replay_plans_evidence_digest_covers_the_three_lists() -> None:
    plan = plan_replay(record(), 1)
    lists = {
        name: [item.model_dump(mode="json") for item in getattr(plan, name)]
        for name in ("retrieval_inputs", "routing_inputs", "gene_inputs")
    }
    assert all(len(items) == 1 for items in lists.values())  # each capped at max_inputs
    assert plan.evidence_digest == canonical_digest(lists)
    assert plan.evidence_digest != plan_replay(record(), 2).evidence_digest


@pytest.mark.parametrize("max_inputs", [0, MAX_REPLAY_INPUTS + 1])
def test_a_replay_cap_outside_its_range_is_refused(max_inputs: int) -> None:
    with pytest.raises(ValueError, match="max_inputs must be"):
        plan_replay(record(), max_inputs)
