"""Shared fakes of the client's unit tests: wire documents, a scripted service and a small store.

Every fake answers through `httpx.MockTransport`, so no socket is opened and
nothing of the server is imported. `Scripted` answers each request with the
next response of its script; `FakeStore` keeps one session's record in memory
and answers the four state endpoints the way the contract describes, which is
enough to drive `ModelServiceSession` through its steps. Both keep every
request they saw and every wait the client asked for instead of sleeping.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

import httpx
import pytest
from sessionstate_client import AsyncSessionStateClient, SessionStateClient, TenantScope

URL = "http://sessionstate.test"
SCOPE = TenantScope(tenant_id="tenant-a", workspace_id="ws-1", session_id="chat-1")
SESSION_PATH = "/v1/tenants/tenant-a/workspaces/ws-1/sessions/chat-1"
GENESIS = "sha256:" + "0" * 64

Answer = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


def sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def decision(action: str = "read", *, allow: bool = True, **overrides: Any) -> dict[str, Any]:
    """A decision trace as the service sends it."""
    trace: dict[str, Any] = {
        "decision_id": f"dec-{action}",
        "action": action,
        "policy": f"sessionstate/{action}",
        "allow": allow,
        "reasons": [] if allow else ["denied_by_test"],
        "policy_revision": "rev-1",
        "input_digest": sha256("input"),
        "evaluated_at": "2026-01-01T00:00:00Z",
        "engine": {"name": "opa", "version": "1.0.0"},
        "latency_ms": 1.5,
    }
    trace.update(overrides)
    return trace


def problem(status: int, reason: str, **members: Any) -> dict[str, Any]:
    """A problem+json document with the given status and reason."""
    return {
        "type": f"https://sessionstate.test/problems/{reason}",
        "title": reason.replace("_", " "),
        "status": status,
        "detail": "what went wrong, in fixed text",
        "reason": reason,
        **members,
    }


def refusal(status: int, reason: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, json=problem(status, reason), headers=headers)


def write_report(applied: bool, blocked: Iterable[str] = ()) -> dict[str, Any]:
    return {
        "applied": applied,
        "durable_write_requested": True,
        "key_digest": sha256("key"),
        "blocked_reasons": list(blocked),
        "preview_only": not applied,
    }


PROFILE: dict[str, Any] = {
    "task_profile": "coding",
    "model_id": "qwen2.5-coder:7b",
    "tokenizer": "qwen2",
    "context_window": 4096,
    "max_tokens": 512,
    "streaming": True,
}


def template(**overrides: Any) -> dict[str, Any]:
    """A session's template: a runtime profile and one anchor of each list."""
    body: dict[str, Any] = {
        "runtime_profile": {**PROFILE, "cancellation_anchor": "stop if the user says cancel"},
        "memory_anchors": [{"anchor_id": "memory:active", "evidence": "user prefers Rust"}],
        "gene_anchors": [{"anchor_id": "gene:rust", "evidence_digest": sha256("gene")}],
        "retrieval_evidence": [{"anchor_id": "doc:borrowck", "evidence": "the borrow checker"}],
        "routing_evidence": [{"anchor_id": "route:coder", "evidence": "coding intent"}],
        "turns": [],
        "source_trace_ids": ["trace:unit"],
    }
    body.update(overrides)
    return body


def sanitized(state: dict[str, Any], compacted: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record a service would make of a state input: digests in place of raw text."""

    def anchors(kind: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {
                "kind": kind,
                "anchor_id": item["anchor_id"],
                "evidence_digest": item.get("evidence_digest") or sha256(item["evidence"]),
            }
            for item in items
        ]

    turns = [
        {
            "turn_id": turn["turn_id"],
            "role": turn["role"],
            "payload_digest": turn.get("payload_digest") or sha256(turn["payload"]),
            "token_estimate": turn.get("token_estimate") or len(turn.get("payload", "")) // 4,
        }
        for turn in state.get("turns", [])
    ]
    profile = {key: value for key, value in state["runtime_profile"].items() if key in PROFILE}
    record: dict[str, Any] = {
        "schema": "sessionstate.record.v2",
        "state_id": state.get("state_id") or "state-unit",
        "scope": SCOPE.model_dump(),
        "runtime_profile": profile,
        "memory_anchors": anchors("memory_chain", state.get("memory_anchors", [])),
        "gene_anchors": anchors("gene_chain", state.get("gene_anchors", [])),
        "retrieval_evidence": anchors("retrieval", state.get("retrieval_evidence", [])),
        "routing_evidence": anchors("routing", state.get("routing_evidence", [])),
        "turns": turns,
        "compacted_turns": compacted or {"count": 0, "token_estimate": 0, "digest": GENESIS},
        "source_trace_ids": state.get("source_trace_ids", []),
    }
    record["state_digest"] = sha256(json.dumps(record, sort_keys=True))
    return record


class FakeService:
    """What every fake keeps: the requests it was sent and the waits the client asked for."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.waits: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return self.answer(request)

    def answer(self, request: httpx.Request) -> httpx.Response:
        raise NotImplementedError

    def bodies(self) -> list[Any]:
        """Each request's body, parsed as JSON (None for an empty one)."""
        return [
            json.loads(request.content) if request.content else None for request in self.requests
        ]

    def sync_client(self, token: Any = "token-1", **options: Any) -> SessionStateClient:
        """A sync client of this fake, which records its waits instead of sleeping them."""
        client = SessionStateClient(URL, token, transport=httpx.MockTransport(self), **options)
        client._sleep = self.waits.append
        return client

    def async_client(self, token: Any = "token-1", **options: Any) -> AsyncSessionStateClient:
        """An asyncio client of this fake, which records its waits instead of sleeping them."""
        client = AsyncSessionStateClient(URL, token, transport=httpx.MockTransport(self), **options)

        async def wait(seconds: float) -> None:
            self.waits.append(seconds)

        client._sleep = wait
        return client


class Scripted(FakeService):
    """Answers the n-th request with the n-th answer of its script; the last one repeats.

    An answer is a response, an exception to raise (a dropped connection, a
    timeout) or a function of the request.
    """

    def __init__(self, *script: Answer) -> None:
        super().__init__()
        if not script:
            raise ValueError("a script needs at least one answer")
        self.script = list(script)

    def answer(self, request: httpx.Request) -> httpx.Response:
        step = self.script[min(len(self.requests), len(self.script)) - 1]
        if isinstance(step, Exception):
            raise step
        if isinstance(step, httpx.Response):  # a fresh copy: a response is sent only once
            return httpx.Response(step.status_code, headers=step.headers, stream=step.stream)
        return step(request)


def approval(approval_id: str = "appr_" + "1" * 24) -> dict[str, Any]:
    return {
        "approval_id": approval_id,
        "tenant_id": "tenant-a",
        "workspace_id": "ws-1",
        "session_id": None,
        "operator": "op-1",
        "reason": "unit",
        "issued_at": "2026-01-01T00:00:00Z",
        "expires_at": "2026-01-01T01:00:00Z",
    }


def log_entry(seq: int, decision_id: str, action: str = "write") -> dict[str, Any]:
    """One entry of the decision log."""
    return {
        "seq": seq,
        "recorded_at": "2026-01-01T00:00:00Z",
        "decision": decision(action, decision_id=decision_id),
        "actor": {"sub": "svc", "roles": ["model-service"], "tenant_id": "tenant-a"},
        "target": {"tenant_id": "tenant-a", "workspace_id": "ws-1", "session_id": "chat-1"},
        "outcome": {"status": 200, "applied": True, "approval_id": None},
        "input": {"action": action},
        "prev_hash": sha256(f"entry {seq - 1}"),
        "hash": sha256(f"entry {seq}"),
    }


def version_summary(version: int) -> dict[str, Any]:
    """One entry of a session's version list."""
    return {
        "version": version,
        "state_digest": sha256(f"version {version}"),
        "written_at": "2026-01-01T00:00:00Z",
        "decision_id": f"dec-write-{version}",
    }


def session_summary(record: dict[str, Any]) -> dict[str, Any]:
    """One entry of a workspace's session list."""
    return {
        "session_id": SCOPE.session_id,
        "version": 2,
        "state_digest": record["state_digest"],
        "updated_at": "2026-01-01T00:00:00Z",
        "expires_at": None,
        "lineage": None,
    }


class Endpoints(FakeService):
    """Answers every endpoint of the contract with a valid answer of its own shape."""

    def answer(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        key = f"{request.method} {path.removeprefix(SESSION_PATH)}"
        record = sanitized(template(turns=[{"turn_id": "t1", "role": "user", "payload": "hi"}]))
        written = {
            "record": record,
            "write_report": write_report(True),
            "decision": decision("write"),
        }
        replay = {
            "allowed": True,
            "retrieval_inputs": [],
            "routing_inputs": [],
            "gene_inputs": [],
            "evidence_digest": sha256("replay"),
            "blocked_reasons": [],
            "history": None,
        }
        by_key: dict[str, Any] = {
            "GET /state": {
                "read_report": {"key_digest": sha256("k"), "record": record, "corrupt": False},
                "decision": decision(),
                "version": 2,
            },
            "PUT /state": {**written, "version": 2},
            "POST /state/preview": written,
            "GET /state/versions": {
                "versions": [version_summary(2), version_summary(1)],
                "next_cursor": None,
                "decision": decision("history"),
            },
            "GET /state/versions/1": {
                "read_report": {"key_digest": sha256("k"), "record": record, "corrupt": False},
                "decision": decision("history"),
                "version": 1,
            },
            "POST /state/rewind": {**written, "decision": decision("rewind"), "version": 3},
            "GET /v1/tenants/tenant-a/workspaces/ws-1/sessions": {
                "sessions": [session_summary(record)],
                "next_cursor": None,
                "decision": decision("list"),
            },
            "DELETE /v1/tenants/tenant-a/workspaces/ws-1/sessions": {
                "sessions_erased": 1,
                "sessions_refused": 0,
                "sessions_changed": 0,
                "complete": True,
                "decision": decision("erase"),
            },
            "POST /fork": {**written, "version": 1},
            "POST /replay-preview": {"preview": replay, "decision": decision("replay")},
            "POST /v1/token": {
                "access_token": "session-token",
                "expires_in": 600,
                "decision": decision("token.exchange"),
            },
            "POST /v1/tenants/tenant-a/workspaces/ws-1/approvals": {
                "approval": approval(),
                "decision": decision("approval.grant"),
            },
            "GET /v1/tenants/tenant-a/workspaces/ws-1/approvals": {
                "approvals": [approval()],
                "decision": decision("approval.list"),
            },
            "GET /v1/decisions": {
                "decisions": [log_entry(1, "d-1")],
                "next_cursor": None,
                "decision": decision("decisions.read", decision_id="d-read"),
            },
            "GET /v1/decisions/verify": {
                "ok": True,
                "entries": 1,
                "head_hash": sha256("entry 1"),
                "first_invalid_seq": None,
                "problem": None,
                "checkpoint": None,
                "checkpoint_public_key": "PEM",
                "walked_from_seq": 1,
                "walked_to_seq": 1,
                "last_full_walk": None,
                "decision": decision("decisions.read"),
            },
            "GET /v1/decisions/policy-revisions": {
                "tenant_id": "tenant-a",
                "complete": True,
                "revisions": [],
                "decision": decision("decisions.read"),
            },
            "GET /healthz": {"status": "ok"},
            "GET /readyz": {
                "ready": True,
                "opa_reachable": True,
                "policy_revision": "rev-1",
                "store_open": True,
                "store_writable": True,
                "store": {"kind": "leveldb", "target": "var/db", "reachable": True},
                "reasons": [],
            },
            "GET /openapi.json": {"openapi": "3.1.0"},
        }
        if key in by_key:
            return httpx.Response(
                201 if key.endswith(("approvals", "/fork")) and request.method == "POST" else 200,
                json=by_key[key],
            )
        if key == "DELETE /state":
            return httpx.Response(204, headers={"Sessionstate-Decision-Id": "d-erase"})
        if key.startswith("DELETE /v1/tenants/"):
            return httpx.Response(204, headers={"Sessionstate-Decision-Id": "d-revoke"})
        if key == "GET /v1/decisions/export":
            lines = [json.dumps({"decision_id": "d-1"}), "", json.dumps({"decision_id": "d-2"})]
            return httpx.Response(200, content="\n".join(lines).encode())
        if key.startswith("GET /v1/decisions/"):
            entry = {
                "entry": log_entry(1, "d-1"),
                "hash_ok": True,
                "decision": decision("decisions.read"),
            }
            return httpx.Response(200, json=entry)
        if key == "GET /metrics":
            return httpx.Response(200, text="sessionstate_up 1\n")
        return refusal(404, "not_found")


class FakeStore(FakeService):
    """One session's record in memory, behind the four state endpoints.

    `writes_allowed` plays the policy: when False a write is denied with
    `blocked` as its reasons (and previews still answer). `window` is how many
    turns a record keeps; older ones are folded into `compacted_turns`.
    `corrupt_digest`, when set, makes the stored record unreadable.
    """

    def __init__(self, *, writes_allowed: bool = True, window: int = 64) -> None:
        super().__init__()
        self.writes_allowed = writes_allowed
        self.blocked = ["session_state_operator_approval_missing"]
        self.window = window
        self.record: dict[str, Any] | None = None
        self.version = 0
        self.corrupt_digest: str | None = None

    def store(self, state: dict[str, Any]) -> dict[str, Any]:
        """Write state as the service would (another writer, or the session's own write)."""
        turns = state.get("turns", [])
        old = self.record["compacted_turns"] if self.record else None
        count = old["count"] if old else 0
        estimate = old["token_estimate"] if old else 0
        dropped = max(0, len(turns) - self.window)
        compacted = {
            "count": count + dropped,
            "token_estimate": estimate + 7 * dropped,
            "digest": sha256(f"compacted {count + dropped}") if count + dropped else GENESIS,
        }
        self.record = sanitized({**state, "turns": turns[dropped:]}, compacted)
        self.version += 1
        self.corrupt_digest = None
        return self.record

    def answer(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix(SESSION_PATH)
        if (request.method, path) == ("GET", "/state"):
            return self._read()
        if (request.method, path) == ("PUT", "/state"):
            return self._write(request)
        if (request.method, path) == ("POST", "/state/preview"):
            record = sanitized(json.loads(request.content))
            answer = {
                "record": record,
                "write_report": write_report(False),
                "decision": decision("preview"),
            }
            return httpx.Response(200, json=answer)
        if (request.method, path) == ("POST", "/replay-preview"):
            return self._replay()
        return refusal(404, "not_found")

    def _read(self) -> httpx.Response:
        report: dict[str, Any]
        if self.corrupt_digest is not None:
            report = {
                "key_digest": sha256("key"),
                "record": None,
                "corrupt": True,
                "redacted_error": "session_state_schema_mismatch",
                "error_digest": self.corrupt_digest,
            }
            answer = {"read_report": report, "decision": decision(), "version": self.version or 1}
            return httpx.Response(200, json=answer)
        if self.record is None:
            return httpx.Response(
                404, json=problem(404, "session_state_not_found", decision=decision())
            )
        report = {"key_digest": sha256("key"), "record": self.record, "corrupt": False}
        answer = {"read_report": report, "decision": decision(), "version": self.version}
        return httpx.Response(200, json=answer)

    def _write(self, request: httpx.Request) -> httpx.Response:
        stored = self.corrupt_digest or (self.record or {}).get("state_digest")
        if_match = request.headers.get("If-Match")
        if_none_match = request.headers.get("If-None-Match")
        if (if_match is not None and if_match != f'"{stored}"') or (
            if_none_match == "*" and stored is not None
        ):
            failed = problem(
                412,
                "precondition_failed",
                decision=decision("write"),
                write_report=write_report(False, ["precondition_failed"]),
            )
            return httpx.Response(412, json=failed)
        if not self.writes_allowed:
            denied = problem(
                403,
                self.blocked[0],
                decision=decision("write", allow=False, reasons=self.blocked),
                write_report=write_report(False, self.blocked),
            )
            return httpx.Response(403, json=denied)
        record = self.store(json.loads(request.content))
        answer = {
            "record": record,
            "write_report": write_report(True),
            "decision": decision("write"),
            "version": self.version,
        }
        return httpx.Response(200, json=answer, headers={"ETag": f'"{record["state_digest"]}"'})

    def _replay(self) -> httpx.Response:
        if self.record is None:
            return httpx.Response(404, json=problem(404, "session_state_not_found"))
        preview = {
            "allowed": True,
            "retrieval_inputs": [],
            "routing_inputs": [],
            "gene_inputs": [],
            "evidence_digest": sha256("served replay"),
            "blocked_reasons": [],
            "history": None,
        }
        return httpx.Response(200, json={"preview": preview, "decision": decision("replay")})

    def paths(self) -> list[str]:
        """Each request as `METHOD /path-below-the-session`."""
        return [f"{r.method} {r.url.path.removeprefix(SESSION_PATH)}" for r in self.requests]


@pytest.fixture
def store() -> FakeStore:
    return FakeStore()
