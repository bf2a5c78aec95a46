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
`AsyncModelServiceSession` is the same over `AsyncSessionStateClient`, each
step awaited.

A session sends with its client's token. A bot holding one service token for
its tenant and workspace builds each session with `for_service(client,
service_token, scope, template)`: the session sends with a token of its own
session, which `SessionTokens` obtains by token exchange on first use and
again shortly before it expires (`client.with_token(source)`, so the steps
stay as they are).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from sessionstate_client.aio import AsyncSessionStateClient, AsyncTokenSource
from sessionstate_client.client import SessionStateClient, TokenSource
from sessionstate_client.contract import TurnRole
from sessionstate_client.digests import DigestKey, estimate_tokens
from sessionstate_client.errors import CorruptState, NotFound, PolicyDenied, PreconditionFailed
from sessionstate_client.models import (
    NO_COMPACTED_TURNS,
    CompactedTurns,
    DecisionTrace,
    ReplayInput,
    RuntimeProfileSummary,
    SessionReplayPreview,
    SessionStateAnchor,
    SessionStateAnchorInput,
    SessionStateInput,
    SessionStateReadResponse,
    SessionStateRecord,
    SessionStateResponse,
    SessionStateWriteReport,
    SessionTurnDigest,
    SessionTurnInput,
    TenantScope,
)
from sessionstate_client.replay import DEFAULT_REPLAY_INPUTS, plan_replay
from sessionstate_client.session_tokens import AsyncSessionTokens, SessionTokens

M = TypeVar("M", bound=BaseModel)
C = TypeVar("C", SessionStateClient, AsyncSessionStateClient)


class RuntimeRequest(BaseModel):
    """What the model runs on for one turn. Built locally; the prompt never leaves."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    scope: TenantScope
    runtime_profile: RuntimeProfileSummary
    prompt: str = Field(repr=False)
    retrieval_inputs: list[ReplayInput]
    routing_inputs: list[ReplayInput]
    gene_inputs: list[ReplayInput]
    evidence_digest: str | None = Field(description="the replay preview's; None if blocked")
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

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    applied: bool
    record: SessionStateRecord = Field(description="the record written, or that would have been")
    write_report: SessionStateWriteReport
    decision: DecisionTrace = Field(description="the write's decision (a refusal if not applied)")
    blocked_reasons: list[str]
    attempts: int = Field(ge=1, description="writes sent: more than one after 412 conflicts")

    @property
    def state_digest(self) -> str:
        return self.record.state_digest


class _SessionSteps(Generic[C]):
    """What both flavours share: the client, the state held, and every step but the sending."""

    def __init__(
        self,
        client: C,
        scope: TenantScope,
        template: SessionStateInput | Mapping[str, Any],
        *,
        digest_key: DigestKey | None = None,
        max_attempts: int = 3,
        replace_corrupt: bool = False,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.client: C = client
        self.scope = _as(TenantScope, scope)
        self.template = _as(SessionStateInput, template)
        self.digest_key = digest_key
        self.max_attempts = max_attempts
        self.replace_corrupt = replace_corrupt
        self.last_decision: DecisionTrace | None = None
        self._base = self.template  # the stored record as input, or the template if none
        self._version: str | None = None  # what If-Match names; None: If-None-Match
        self._stored = False  # a readable record is stored
        self._compacted = NO_COMPACTED_TURNS  # the summary of the record held
        self._unsaved: list[SessionTurnInput] = []  # previewed, not yet written
        self._options: dict[str, Any] = {
            "digest_key": digest_key,
            "max_attempts": max_attempts,
            "replace_corrupt": replace_corrupt,
        }
        # for_service's: the client and the workspace's token a fork is sent with
        self._service: tuple[C, Any] | None = None

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
            return SessionTurnInput.model_validate(
                {"turn_id": turn_id, "role": role, "payload": text}
            )
        return SessionTurnInput.model_validate(
            {
                "turn_id": turn_id,
                "role": role,
                "payload_digest": self.digest_key.digest_text(text),
                "token_estimate": estimate_tokens(text),
            }
        )

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

    # --- step 1, after the read ------------------------------------------------------------

    def _absent(self) -> SessionStateInput:
        """Nothing stored: start from the template (or keep what is held)."""
        if self._stored:  # it was there: the store was reset under us; start over
            self._base, self._stored = self.template, False
            self._compacted = NO_COMPACTED_TURNS
        self._version = None
        return self.state

    def _read(self, read: SessionStateReadResponse) -> SessionStateInput:
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

    # --- a fork ------------------------------------------------------------------------------

    def _fork_client(self) -> C:
        """Who sends a fork: a bot's session its service token (a session's token may not
        fork), any other session its own client."""
        if self._service is None:
            return self.client
        client, service_token = self._service
        forker: C = client.with_token(service_token)
        return forker

    def _holding(self, forked: SessionStateResponse) -> None:
        """A fork's target session: it holds the record the fork wrote."""
        self.last_decision = forked.decision
        self._adopt(forked.record)

    # --- step 2, without a stored record -----------------------------------------------------

    def _planned(
        self, previewed: SessionStateResponse, max_inputs: int | None
    ) -> SessionReplayPreview:
        self.last_decision = previewed.decision
        return plan_replay(previewed.record, max_inputs or DEFAULT_REPLAY_INPUTS)

    # --- step 4, around the writes -----------------------------------------------------------

    def _written(self, written: SessionStateResponse, attempts: int) -> CommitResult:
        self.last_decision = written.decision
        self._adopt(written.record)
        self._unsaved = []
        return CommitResult(
            applied=True,
            record=written.record,
            write_report=written.write_report,
            decision=written.decision,
            blocked_reasons=[],
            attempts=attempts,
        )

    def _previewed(
        self, previewed: SessionStateResponse, denied: PolicyDenied, attempts: int
    ) -> CommitResult:
        """The write was refused and the state previewed: hold the new turns, as digests."""
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

    def _before_reread(self) -> tuple[set[str], int]:
        """The turn ids of the record held, and how many turns it had seen in all."""
        held = {turn.turn_id for turn in self._base.turns}
        return held, self._compacted.count + len(held)

    def _after_reread(
        self,
        pending: Sequence[SessionTurnInput],
        conflict: PreconditionFailed,
        held: set[str],
        seen: int,
    ) -> list[SessionTurnInput]:
        """After a 412 and a re-read: the turns of `pending` still to write, by turn id.

        Turns the held record kept are stored already (the fresh record may have
        compacted them since): they are never sent again. If the fresh record
        keeps any of the others, an attempt of ours landed with all of them.
        """
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


class ModelServiceSession(_SessionSteps[SessionStateClient]):
    """A model service's view of one session's state, kept in step with sessionstate.

    `template` is the state a new session starts from: the runtime profile the
    model runs with (always sent, also over a stored record's) and the anchors;
    a `SessionStateInput`, or the same as a mapping (or a model of that shape).
    With a `digest_key`, new turns are digested here and their text never
    leaves the process; without, the text is sent as `payload` and the service
    digests it under the deployment's key and drops it.
    """

    @classmethod
    def for_service(
        cls,
        client: SessionStateClient,
        service_token: TokenSource,
        scope: TenantScope | Mapping[str, Any],
        template: SessionStateInput | Mapping[str, Any],
        **options: Any,
    ) -> ModelServiceSession:
        """A session of a bot: `service_token` (its tenant's and workspace's, no session)
        is exchanged for the session's own token when the session first sends, and
        again shortly before that expires; `client`'s connections are shared."""
        session_scope = _as(TenantScope, scope)
        tokens = SessionTokens(client, service_token, session_scope)
        session = cls(client.with_token(tokens), session_scope, template, **options)
        session._service = (client, service_token)
        return session

    # Step 1
    def load(self) -> SessionStateInput:
        """Read the stored state; none stored: start from the template (or keep what is held).

        A corrupt record raises `CorruptState`, unless `replace_corrupt`: then the
        session starts from the template and its first write replaces the record.
        """
        try:
            read = self.client.get_state(self.scope)
        except NotFound:
            return self._absent()
        return self._read(read)

    # Step 2
    def replay(self, max_inputs: int | None = None) -> SessionReplayPreview:
        """The replay preview of the stored record; with none stored, of the state held.

        With nothing stored (a new or preview-only session), the service previews
        the state held, under the preview policy, and the replay inputs are
        planned from that sanitized record here, as the service plans them.
        """
        if self._stored:
            try:
                answer = self.client.replay_preview(self.scope, max_inputs)
            except NotFound:  # the store was reset under us: start over, as load() does
                self._absent()
            else:
                self.last_decision = answer.decision
                return answer.preview
        return self._planned(self.client.preview_state(self.scope, self.state), max_inputs)

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
        digests, and the next allowed write stores them. (An access refusal,
        wrong role or scope, refuses the preview too, and is raised.)
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
                held, seen = self._before_reread()
                self.load()
                pending = self._after_reread(pending, conflict, held, seen)
                continue
            except PolicyDenied as denied:
                previewed = self.client.preview_state(self.scope, state)
                return self._previewed(previewed, denied, attempt)
            return self._written(written, attempt)

    def fork(self, to_session_id: str, from_version: int | None = None) -> ModelServiceSession:
        """Fork this session: a new session `to_session_id` of the same workspace from
        version `from_version` (None: the current one), and the session object for it,
        holding the record the fork wrote (with its `lineage`).

        Sent with this session's client, or for a bot's session (`for_service`) with its
        service token: the default policy lets a token of the whole workspace fork, not a
        session's. The new session takes the same template and options, and for a bot's
        session its own session token. `Conflict` if the target holds a record already.
        """
        forked = self._fork_client().fork(self.scope, to_session_id, from_version)
        target = forked.record.scope
        if self._service is None:
            session = ModelServiceSession(self.client, target, self.template, **self._options)
        else:
            client, service_token = self._service
            session = ModelServiceSession.for_service(
                client, service_token, target, self.template, **self._options
            )
        session._holding(forked)
        return session


class AsyncModelServiceSession(_SessionSteps[AsyncSessionStateClient]):
    """`ModelServiceSession` over an `AsyncSessionStateClient`: the same steps, awaited."""

    @classmethod
    def for_service(
        cls,
        client: AsyncSessionStateClient,
        service_token: AsyncTokenSource,
        scope: TenantScope | Mapping[str, Any],
        template: SessionStateInput | Mapping[str, Any],
        **options: Any,
    ) -> AsyncModelServiceSession:
        """`ModelServiceSession.for_service`, over the asyncio client."""
        session_scope = _as(TenantScope, scope)
        tokens = AsyncSessionTokens(client, service_token, session_scope)
        session = cls(client.with_token(tokens), session_scope, template, **options)
        session._service = (client, service_token)
        return session

    # Step 1
    async def load(self) -> SessionStateInput:
        """`ModelServiceSession.load`, awaited."""
        try:
            read = await self.client.get_state(self.scope)
        except NotFound:
            return self._absent()
        return self._read(read)

    # Step 2
    async def replay(self, max_inputs: int | None = None) -> SessionReplayPreview:
        """`ModelServiceSession.replay`, awaited."""
        if self._stored:
            try:
                answer = await self.client.replay_preview(self.scope, max_inputs)
            except NotFound:  # the store was reset under us: start over, as load() does
                self._absent()
            else:
                self.last_decision = answer.decision
                return answer.preview
        previewed = await self.client.preview_state(self.scope, self.state)
        return self._planned(previewed, max_inputs)

    # Step 4
    async def commit_turns(self, turns: Sequence[SessionTurnInput]) -> CommitResult:
        """`ModelServiceSession.commit_turns`, awaited: the same writes, re-reads and fallback."""
        pending = [*self._unsaved, *turns]
        attempt = 0
        while True:
            attempt += 1
            state = _with_turns(self._base, pending)
            try:
                written = await self.client.put_state(
                    self.scope,
                    state,
                    if_match=self._version,
                    if_none_match=self._version is None,
                )
            except PreconditionFailed as conflict:
                if attempt >= self.max_attempts:
                    raise
                held, seen = self._before_reread()
                await self.load()
                pending = self._after_reread(pending, conflict, held, seen)
                continue
            except PolicyDenied as denied:
                previewed = await self.client.preview_state(self.scope, state)
                return self._previewed(previewed, denied, attempt)
            return self._written(written, attempt)

    async def fork(
        self, to_session_id: str, from_version: int | None = None
    ) -> AsyncModelServiceSession:
        """`ModelServiceSession.fork`, awaited."""
        forked = await self._fork_client().fork(self.scope, to_session_id, from_version)
        target = forked.record.scope
        if self._service is None:
            session = AsyncModelServiceSession(self.client, target, self.template, **self._options)
        else:
            client, service_token = self._service
            session = AsyncModelServiceSession.for_service(
                client, service_token, target, self.template, **self._options
            )
        session._holding(forked)
        return session


def _as(model: type[M], value: BaseModel | Mapping[str, Any]) -> M:
    """value as model: itself, else validated from its fields (a mapping, or another
    package's model of the same shape, such as the service's own)."""
    if isinstance(value, model):
        return value
    fields = value.model_dump(mode="json", by_alias=True) if isinstance(value, BaseModel) else value
    return model.model_validate(fields)


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
