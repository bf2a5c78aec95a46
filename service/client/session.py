"""`ModelServiceSession`: the design note's five steps of a local model service, as one API.

1. `load()` builds or loads the state of the session's scope;
2. `replay()` previews the memory, retrieval, routing and gene inputs;
3. `runtime_request(prompt, preview)` builds the `RuntimeRequest` for the model
   from the previewed anchors and the prompt, here: it is never sent;
4. `commit_turns(turns)` writes the sanitized turns if policy allows, and
   falls back to preview-only without raising when it does not;
5. raw transcripts are no business of this class: it holds turns as digests
   once committed, and a product that needs transcripts keeps them elsewhere.

The state held is a `SessionStateInput`: the stored record's anchors and
the turns it keeps, as digests (with the session's configured runtime
profile), plus the turns that could only be previewed, which the next allowed
write stores. A long session's record keeps only the newest turns (the
service's window) and summarises older ones in `compacted_turns`; the session
holds and sends that window plus what is new, never the whole history, so a
turn costs the same at the 10,000th exchange as at the 10th.
One session object serves one conversation at a time; it is not thread-safe.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from service.client.api import SessionStateClient
from service.client.errors import CorruptState, NotFound, PolicyDenied, PreconditionFailed
from service.policy.trace import DecisionTrace
from service.replay import (
    DEFAULT_REPLAY_INPUTS,
    ReplayInput,
    RuntimeProfileSummary,
    SessionReplayPlanner,
    SessionReplayPreview,
)
from store.builder import estimate_tokens
from store.digests import Digest, DigestKey
from store.inputs import SessionStateAnchorInput, SessionStateInput, SessionTurnInput, TurnRole
from store.record import (
    NO_COMPACTED_TURNS,
    CompactedTurns,
    SessionStateAnchor,
    SessionStateRecord,
    SessionTurnDigest,
)
from store.reports import SessionStateWriteReport
from store.scope import TenantScope


class RuntimeRequest(BaseModel):
    """What the model runs on for one turn. Built locally; the prompt never leaves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scope: TenantScope
    runtime_profile: RuntimeProfileSummary
    prompt: str = Field(repr=False)
    retrieval_inputs: list[ReplayInput]
    routing_inputs: list[ReplayInput]
    gene_inputs: list[ReplayInput]
    evidence_digest: Digest | None = Field(description="the replay preview's; None if blocked")
    replay_blocked_reasons: list[str]
    history_turns: int = Field(
        ge=0, description="turns of the session before this one, compacted ones included"
    )
    history_token_estimate: int = Field(ge=0)
    compacted_turns: int = Field(
        ge=0, description="of history_turns, those the record summarises and no longer keeps"
    )


class CommitResult(BaseModel):
    """What `commit_turns` did: written (`applied`), or previewed only, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    applied: bool
    record: SessionStateRecord = Field(description="the record written, or that would have been")
    write_report: SessionStateWriteReport
    decision: DecisionTrace = Field(description="the write's decision (a refusal if not applied)")
    blocked_reasons: list[str]
    attempts: int = Field(ge=1, description="writes sent: more than one after 412 conflicts")

    @property
    def state_digest(self) -> str:
        return self.record.state_digest


class ModelServiceSession:
    """A model service's view of one session's state, kept in step with sessionstate.

    `template` is the state a new session starts from: the runtime profile the
    model runs with (always sent, also over a stored record's) and the anchors.
    With a `digest_key`, new turns are digested here and their text never
    leaves the process; without, the text is sent as `payload` and the service
    digests it under the deployment's key and drops it.
    """

    def __init__(
        self,
        client: SessionStateClient,
        scope: TenantScope,
        template: SessionStateInput,
        *,
        digest_key: DigestKey | None = None,
        max_attempts: int = 3,
        replace_corrupt: bool = False,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.client = client
        self.scope = scope
        self.template = template
        self.digest_key = digest_key
        self.max_attempts = max_attempts
        self.replace_corrupt = replace_corrupt
        self.last_decision: DecisionTrace | None = None
        self._base = template  # the stored record as input, or the template if none
        self._version: str | None = None  # what If-Match names; None: If-None-Match
        self._stored = False  # a readable record is stored
        self._compacted = NO_COMPACTED_TURNS  # the summary of the record held
        self._unsaved: list[SessionTurnInput] = []  # previewed, not yet written

    @property
    def state(self) -> SessionStateInput:
        """The state held: the stored (or new) state plus the turns not yet written."""
        return _with_turns(self._base, self._unsaved)

    @property
    def compacted(self) -> CompactedTurns:
        """The summary of the turns the stored record no longer keeps (count 0: none)."""
        return self._compacted

    @property
    def version(self) -> str | None:
        """The stored version the next write replaces (its ETag), or None if none is stored."""
        return self._version

    def turn(self, role: TurnRole, text: str) -> SessionTurnInput:
        """A new turn with a fresh id: digested here with `digest_key`, else raw for the service."""
        turn_id = "turn-" + secrets.token_hex(8)
        if self.digest_key is None:
            return SessionTurnInput(turn_id=turn_id, role=role, payload=text)
        return SessionTurnInput(
            turn_id=turn_id,
            role=role,
            payload_digest=self.digest_key.digest_text(text),
            token_estimate=estimate_tokens(text),
        )

    # Step 1
    def load(self) -> SessionStateInput:
        """Read the stored state; none stored: start from the template (or keep what is held).

        A corrupt record raises `CorruptState`, unless `replace_corrupt`: then the
        session starts from the template and its first write replaces the record.
        """
        try:
            read = self.client.get_state(self.scope)
        except NotFound:
            if self._stored:  # it was there: the store was reset under us; start over
                self._base, self._stored = self.template, False
                self._compacted = NO_COMPACTED_TURNS
            self._version = None
            return self.state
        self.last_decision = read.decision
        report = read.read_report
        if report.record is not None:
            if not (self._stored and report.record.state_digest == self._version):
                self._adopt(report.record)  # (the version held needs no second conversion)
        elif self.replace_corrupt and report.error_digest is not None:
            self._base, self._stored, self._version = self.template, False, report.error_digest
            self._compacted = NO_COMPACTED_TURNS
        else:
            raise CorruptState(report)
        return self.state

    # Step 2
    def replay(self, max_inputs: int | None = None) -> SessionReplayPreview:
        """The replay preview of the stored record; with none stored, of the state held.

        With nothing stored (a new or preview-only session), the service previews
        the state held, under the preview policy, and the replay inputs are
        planned from that sanitized record by the service's own planner.
        """
        if self._stored:
            try:
                answer = self.client.replay_preview(self.scope, max_inputs)
            except NotFound:
                self._stored = False
            else:
                self.last_decision = answer.decision
                return answer.preview
        previewed = self.client.preview_state(self.scope, self.state)
        self.last_decision = previewed.decision
        return SessionReplayPlanner().preview(previewed.record, max_inputs or DEFAULT_REPLAY_INPUTS)

    # Step 3
    def runtime_request(self, prompt: str, preview: SessionReplayPreview) -> RuntimeRequest:
        """The model's input for this turn: the prompt with the previewed inputs. Not sent."""
        held = self.state.turns
        profile = self.template.runtime_profile.model_dump(exclude={"cancellation_anchor"})
        return RuntimeRequest(
            scope=self.scope,
            runtime_profile=RuntimeProfileSummary.model_validate(profile),
            prompt=prompt,
            retrieval_inputs=preview.retrieval_inputs,
            routing_inputs=preview.routing_inputs,
            gene_inputs=preview.gene_inputs,
            evidence_digest=preview.evidence_digest,
            replay_blocked_reasons=preview.blocked_reasons,
            history_turns=self._compacted.count + len(held),
            history_token_estimate=self._compacted.token_estimate
            + sum(turn.token_estimate or 0 for turn in held),
            compacted_turns=self._compacted.count,
        )

    # Step 4
    def commit_turns(self, turns: Sequence[SessionTurnInput]) -> CommitResult:
        """Write the state with `turns` appended, if the policy allows; else preview it.

        The write names the version held (`If-Match`, or `If-None-Match: *`)
        and carries the turns the record keeps plus the new ones; the service
        compacts the oldest beyond its window. On 412 the session re-reads
        (dropping turns the fresh record compacted), appends its turns the
        fresh record lacks (by turn id) and writes again, up to `max_attempts`
        writes; then the last `PreconditionFailed` is raised. It is raised at
        once, too, when an earlier attempt of this write may have landed (its
        answer was lost) and the fresh record compacted turns the session
        never saw: its own turns could be among them, and sending them again
        would count them twice. On 403 it previews instead and returns
        `applied=False` with every blocked reason: the turns stay held, as
        digests, and the next allowed write stores them.
        """
        pending = [*self._unsaved, *turns]
        attempt = 0
        while True:
            attempt += 1
            state = _with_turns(self._base, pending)
            try:
                written = self.client.put_state(
                    self.scope,
                    state,
                    if_match=self._version,
                    if_none_match=self._version is None,
                )
            except PreconditionFailed as conflict:
                if attempt >= self.max_attempts:
                    raise
                pending = self._after_conflict(pending, conflict)
                continue
            except PolicyDenied as denied:
                return self._preview_only(state, denied, attempt)
            self.last_decision = written.decision
            self._adopt(written.record)
            self._unsaved = []
            return CommitResult(
                applied=True,
                record=written.record,
                write_report=written.write_report,
                decision=written.decision,
                blocked_reasons=[],
                attempts=attempt,
            )

    def _preview_only(
        self, state: SessionStateInput, denied: PolicyDenied, attempts: int
    ) -> CommitResult:
        # An access refusal (wrong role or scope) refuses the preview too, and is raised.
        previewed = self.client.preview_state(self.scope, state)
        self.last_decision = previewed.decision
        known = {turn.turn_id for turn in self._base.turns}
        self._unsaved = [
            _turn_input(turn) for turn in previewed.record.turns if turn.turn_id not in known
        ]
        return CommitResult(
            applied=False,
            record=previewed.record,
            write_report=denied.write_report or previewed.write_report,
            decision=denied.decision,
            blocked_reasons=denied.reasons,
            attempts=attempts,
        )

    def _after_conflict(
        self, pending: Sequence[SessionTurnInput], conflict: PreconditionFailed
    ) -> list[SessionTurnInput]:
        """Re-read after a 412: the turns of `pending` still to write, matched by turn id.

        Turns the held record kept are stored already (the fresh record may have
        compacted them since): they are never sent again. If the fresh record
        keeps any of the others, an attempt of ours landed with all of them.
        """
        held = {turn.turn_id for turn in self._base.turns}
        seen = self._compacted.count + len(held)
        self.load()
        kept = {turn.turn_id for turn in self._base.turns}
        new = [turn for turn in pending if turn.turn_id not in held]
        if any(turn.turn_id in kept for turn in new):
            return []
        if new and conflict.attempts > 1 and self._compacted.count > seen:
            # An attempt may have landed (its answer was lost) and turns we never saw were
            # compacted since: ours could be among them. Sending them again could count twice.
            raise conflict
        return new

    def _adopt(self, record: SessionStateRecord) -> None:
        """Hold record as the stored version: digests only, with the configured profile."""
        self._base = SessionStateInput(
            state_id=record.state_id,
            runtime_profile=self.template.runtime_profile,
            memory_anchors=_anchor_inputs(record.memory_anchors),
            gene_anchors=_anchor_inputs(record.gene_anchors),
            retrieval_evidence=_anchor_inputs(record.retrieval_evidence),
            routing_evidence=_anchor_inputs(record.routing_evidence),
            turns=[_turn_input(turn) for turn in record.turns],
            source_trace_ids=list(record.source_trace_ids),
        )
        self._version = record.state_digest
        self._stored = True
        self._compacted = record.summary


def _with_turns(state: SessionStateInput, turns: Iterable[SessionTurnInput]) -> SessionStateInput:
    """state with turns appended, skipping those whose id it already holds."""
    known = {turn.turn_id for turn in state.turns}
    added = [turn for turn in turns if turn.turn_id not in known]
    return state.model_copy(update={"turns": [*state.turns, *added]}) if added else state


def _anchor_inputs(anchors: Iterable[SessionStateAnchor]) -> list[SessionStateAnchorInput]:
    return [
        SessionStateAnchorInput(anchor_id=anchor.anchor_id, evidence_digest=anchor.evidence_digest)
        for anchor in anchors
    ]


def _turn_input(turn: SessionTurnDigest) -> SessionTurnInput:
    """A stored turn as input: its digest and estimate, no text."""
    return SessionTurnInput(
        turn_id=turn.turn_id,
        role=turn.role,
        payload_digest=turn.payload_digest,
        token_estimate=turn.token_estimate,
    )
