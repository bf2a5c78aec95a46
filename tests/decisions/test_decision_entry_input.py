"""A decision entry's `input` is the document sent to OPA, held with the bytes sent: the
request encodes the policy input once (`service.decisions.log.entry_body`)."""

from __future__ import annotations

from service.auth.tokens import Actor
from service.decisions.log import DecisionEntryBody, DecisionOutcome, entry_body
from service.policy.client import EncodedInput
from store.canonical import Encoded, canonical_json
from store.chain.entry import seal
from store.chain.head import GENESIS
from tests.support.factories import decision_entry_body
from tests.support.policy_inputs import allowed_input

ACTOR = Actor(sub="svc-1", roles=("model-service",), tenant_id="tenant-a")
OUTCOME = DecisionOutcome(status=200, applied=False, approval_id=None)
AT = "2026-12-03T12:00:00.000Z"


def _sealed_bytes(body: DecisionEntryBody) -> bytes:
    sealable = body.sealable(OUTCOME, AT)
    [entry], _ = seal(
        [sealable],
        GENESIS,
        "tenant-a",
        encoded_members=[body.encoded_members],
    )
    return entry.value


def test_the_entry_holds_the_bytes_sent_to_opa() -> None:
    sent = EncodedInput.of(allowed_input("read"))
    trace = decision_entry_body("d-1").decision
    body = entry_body(trace, sent, ACTOR)
    held = body.encoded_members["input"]
    assert held.data is sent.encoded  # not encoded again
    assert held.data == canonical_json(body.input) and held.value == sent.document
    # Sealed, the entry is byte for byte the one built from the document alone.
    fresh = DecisionEntryBody(
        decision=trace, actor=ACTOR.to_policy(), target=body.target, input=sent.document
    )
    assert _sealed_bytes(body) == _sealed_bytes(fresh)


def test_a_copy_with_another_input_encodes_its_own() -> None:
    body = entry_body(decision_entry_body("d-2").decision, EncodedInput.of(allowed_input()), ACTOR)
    copied = body.model_copy(update={"input": {"other": 1}})
    assert copied.encoded_members["input"] == Encoded.of({"other": 1})
