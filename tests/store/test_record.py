"""The record (docs/api.md): sanitized, digested, flagged, and validated."""

from __future__ import annotations

import hashlib
import json

import pytest
import rfc8785
from pydantic import ValidationError

from store.digests import DigestKey
from store.record.blockers import Blocker
from store.record.inputs import SessionStateInput
from store.record.validation import record_blockers
from store.record.violations import UNKNOWN_MEMBER, InputRejected, violations_of
from store.scope import TenantScope, is_scope_id
from tests.support.factories import GENE_DIGEST, record, scope, state_input


def rules_of(body: dict[str, object]) -> set[tuple[tuple[object, ...], str]]:
    with pytest.raises(ValidationError) as caught:
        SessionStateInput.model_validate(body)
    return {(v.loc, v.rule) for v in violations_of(caught.value, SessionStateInput)}


def test_record_keeps_scope_profile_and_anchors_with_redacted_turn_digests(
    digest_key: DigestKey,
) -> None:
    built = record(digest_key).to_json()
    assert built["schema"] == "sessionstate.record.v2"
    assert built["compacted_turns"] == {
        "count": 0,
        "token_estimate": 0,
        "digest": "sha256:" + "0" * 64,
    }
    assert built["scope"] == {
        "tenant_id": "tenant-a",
        "workspace_id": "ws-1",
        "session_id": "chat-1",
    }
    assert built["runtime_profile"]["model_id"] == "qwen2.5-coder:7b"
    assert built["runtime_profile"]["cancellation_anchor_digest"].startswith("hmac-sha256:")
    assert [a["anchor_id"] for a in built["memory_anchors"]] == ["memory:active"]
    assert built["gene_anchors"] == [
        {"kind": "gene_chain", "anchor_id": "gene:rust-coding", "evidence_digest": GENE_DIGEST}
    ]
    assert [a["kind"] for a in built["retrieval_evidence"]] == ["retrieval"]
    assert [a["kind"] for a in built["routing_evidence"]] == ["routing"]
    for turn in built["turns"]:
        assert set(turn) == {"turn_id", "role", "payload_digest", "token_estimate"}
        assert turn["payload_digest"].startswith(f"hmac-sha256:{digest_key.key_id}:")
    assert "fix my lifetime error" not in json.dumps(built)


def test_default_flags_hold(digest_key: DigestKey) -> None:
    built = record(digest_key)
    assert built.raw_messages_stored is False
    assert (built.read_only, built.report_only, built.preview_only) == (True, True, True)
    assert built.write_allowed is False
    assert record_blockers(built) == []


def test_state_digest_is_sha256_of_canonical_json_without_itself(digest_key: DigestKey) -> None:
    built = record(digest_key).to_json()
    content = {k: v for k, v in built.items() if k != "state_digest"}
    expected = "sha256:" + hashlib.sha256(rfc8785.dumps(content)).hexdigest()
    assert built["state_digest"] == expected


def test_raw_text_is_digested_with_hmac_under_the_key_id(digest_key: DigestKey) -> None:
    other = DigestKey(b"z" * 32)
    ours = record(digest_key).turns[0].payload_digest
    theirs = record(other).turns[0].payload_digest
    assert ours != theirs
    assert ours.split(":")[1] == digest_key.key_id != other.key_id


def test_caller_digest_is_kept_as_given_never_rehashed(digest_key: DigestKey) -> None:
    given = "hmac-sha256:upstream-key:" + "0f" * 32
    built = record(
        digest_key,
        turns=[{"turn_id": "t1", "role": "user", "payload_digest": given, "token_estimate": 9}],
    )
    assert built.turns[0].payload_digest == given
    assert built.turns[0].token_estimate == 9


@pytest.mark.parametrize(
    "bad",
    [
        "sha256:" + "AB" * 32,  # uppercase hex
        "sha256:" + "ab" * 31,  # short
        "md5:" + "ab" * 16,
        "hmac-sha256::" + "ab" * 32,  # empty key id
        "hmac-sha256:key id:" + "ab" * 32,
        "sha256:" + "ab" * 32 + "\n",
        "plain text",
    ],
)
def test_malformed_caller_digest_is_a_validation_error(bad: str) -> None:
    body = state_input(gene_anchors=[{"anchor_id": "gene:x", "evidence_digest": bad}])
    assert rules_of(body) == {(("gene_anchors", 0, "evidence_digest"), "string_pattern_mismatch")}


def test_anchor_needs_exactly_one_of_evidence_and_digest() -> None:
    both = {"anchor_id": "memory:a", "evidence": "x", "evidence_digest": GENE_DIGEST}
    neither = {"anchor_id": "memory:b"}
    body = state_input(memory_anchors=[both, neither])
    assert rules_of(body) == {
        (("memory_anchors", 0), "exactly_one_of"),
        (("memory_anchors", 1), "exactly_one_of"),
    }


def test_turn_needs_exactly_one_of_payload_and_digest() -> None:
    body = state_input(turns=[{"turn_id": "t", "role": "user"}])
    assert rules_of(body) == {(("turns", 0), "exactly_one_of")}


def test_validation_errors_never_carry_the_value() -> None:
    secret = "CANARY-" + "x" * 20
    body = state_input(turns=[{"turn_id": secret + " bad id", "role": "user", "payload": secret}])
    with pytest.raises(ValidationError) as caught:
        SessionStateInput.model_validate(body)
    assert secret not in str(caught.value)
    assert secret not in repr(violations_of(caught.value, SessionStateInput))


def test_max_tokens_must_fit_the_context_window() -> None:
    profile = state_input()["runtime_profile"] | {"max_tokens": 8192}
    assert rules_of(state_input(runtime_profile=profile)) == {
        (("runtime_profile",), "max_tokens_exceeds_context_window")
    }


def test_lists_and_strings_are_bounded() -> None:
    many = [{"anchor_id": f"m{i}", "evidence": "e"} for i in range(257)]
    assert rules_of(state_input(memory_anchors=many)) == {(("memory_anchors",), "too_long")}
    huge = [{"turn_id": "t", "role": "user", "payload": "x" * 65_537}]
    assert rules_of(state_input(turns=huge)) == {(("turns", 0, "payload"), "string_too_long")}


def test_unknown_fields_are_rejected_by_position_not_name() -> None:
    assert rules_of(state_input(raw_messages_stored=True)) == {
        ((UNKNOWN_MEMBER,), "extra_forbidden")
    }


def test_exact_duplicates_collapse_to_one(digest_key: DigestKey) -> None:
    anchor = {"anchor_id": "memory:active", "evidence": "same"}
    turn = {"turn_id": "turn-1", "role": "user", "payload": "same"}
    built = record(
        digest_key,
        memory_anchors=[anchor, anchor],
        turns=[turn, turn],
        source_trace_ids=["trace:a", "trace:a", "trace:b"],
    )
    assert len(built.memory_anchors) == 1
    assert len(built.turns) == 1
    assert built.source_trace_ids == ["trace:a", "trace:b"]


def test_same_id_with_different_content_is_rejected_not_picked(digest_key: DigestKey) -> None:
    anchors = [
        {"anchor_id": "memory:active", "evidence": "one"},
        {"anchor_id": "memory:active", "evidence": "two"},
    ]
    with pytest.raises(InputRejected) as caught:
        record(digest_key, memory_anchors=anchors)
    assert [(v.loc, v.rule) for v in caught.value.violations] == [
        (("memory_anchors", 1, "anchor_id"), "duplicate_id_conflict")
    ]


def test_missing_memory_and_gene_anchors_are_blockers(digest_key: DigestKey) -> None:
    built = record(digest_key, memory_anchors=[], gene_anchors=[])
    assert record_blockers(built) == [
        Blocker.GENE_ANCHOR_MISSING,
        Blocker.MEMORY_ANCHOR_MISSING,
    ]


@pytest.mark.parametrize(
    ("change", "blocker"),
    [
        ({"raw_messages_stored": True}, Blocker.RAW_MESSAGES_FORBIDDEN),
        ({"read_only": False}, Blocker.PREVIEW_FLAGS_INVALID),
        ({"report_only": False}, Blocker.PREVIEW_FLAGS_INVALID),
        ({"preview_only": False}, Blocker.PREVIEW_FLAGS_INVALID),
        ({"write_allowed": True}, Blocker.PREVIEW_FLAGS_INVALID),
        ({"schema_": "sessionstate.record.v0"}, Blocker.SCHEMA_MISMATCH),
    ],
)
def test_changed_flags_and_schema_are_blockers(
    digest_key: DigestKey, change: dict[str, object], blocker: Blocker
) -> None:
    changed = record(digest_key).model_copy(update=change)
    changed = changed.model_copy(update={"state_digest": changed.computed_state_digest()})
    assert record_blockers(changed) == [blocker]


def test_digest_mismatch_is_a_blocker(digest_key: DigestKey) -> None:
    changed = record(digest_key).model_copy(update={"state_id": "state-other"})
    assert record_blockers(changed) == [Blocker.DIGEST_MISMATCH]


def test_default_state_id_is_stable_per_scope(digest_key: DigestKey) -> None:
    assert record(digest_key).state_id == record(digest_key).state_id
    assert record(digest_key).state_id != record(digest_key, scope("tenant-b")).state_id


@pytest.mark.parametrize(
    "bad",
    ["Tenant A", "tenant a", " tenant", "tenant\n", ".hidden", "", "a" * 129, "tenant/a", "ténant"],
)
def test_scope_ids_are_rejected_never_normalised(bad: str) -> None:
    assert not is_scope_id(bad)
    with pytest.raises(ValidationError):
        TenantScope(tenant_id=bad, workspace_id="w", session_id="s")


def test_scope_ids_differing_in_any_byte_are_different_scopes(digest_key: DigestKey) -> None:
    upper = record(digest_key, scope("Tenant_A"))
    lower = record(digest_key, scope("tenant_a"))
    assert upper.scope != lower.scope
    assert upper.state_digest != lower.state_digest
