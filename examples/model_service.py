"""A tiny local model service: an echo "model" that chats through sessionstate.

Each prompt goes through the design note's five steps with the Python client:
load the session's state, preview the replay inputs, build the runtime request
from them and the prompt, run the model, and commit the user and assistant
turns. Only digests of the turns are stored, and only if the deployment, an
operator's approval and the policy allow; otherwise the chat goes on
preview-only. The transcript itself (step 5) stays in this process. A chat
may go on for ever: the stored record keeps the newest turns and summarises
the older ones, and each exchange sends only that window and the new turns.

    SVC=$(.venv/bin/sessionstate token --sub demo-model --role model-service \\
          --tenant acme --workspace support --session chat-1)
    SESSIONSTATE_URL=http://127.0.0.1:8080 SESSIONSTATE_TOKEN=$SVC \\
      .venv/bin/python examples/model_service.py "hello" "what did I just say?"

It needs only the client distribution (`pip install clients/python`, import
name `sessionstate_client`), not the service. `--asyncio` runs the same
conversation with the asyncio client and `AsyncModelServiceSession`, as an
asyncio model service (FastAPI, a proxy in front of an inference server)
would. The scope comes from the token's claims unless --tenant, --workspace
and --session name it. Replies go to stdout, one a line; what happened to the
state at each turn goes to stderr.

As a bot (`--sessions user-1,user-2,user-3`) it serves several sessions with
one service token of its tenant and workspace (no session claim), as a
multi-tenant bot does: each session is a `ModelServiceSession.for_service`,
which exchanges the service token for that session's own token
(`POST /v1/token`) when the session first sends, and again before it expires.
Each prompt goes to every session in turn; replies are prefixed with their
session's id.

    BOT=$(.venv/bin/sessionstate token --sub demo-bot --role model-service \\
          --tenant acme --workspace support)
    SESSIONSTATE_TOKEN=$BOT .venv/bin/python examples/model_service.py \\
      --sessions user-1,user-2,user-3 "hello"
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
from collections.abc import Sequence

from sessionstate_client import (
    AsyncModelServiceSession,
    AsyncSessionStateClient,
    CommitResult,
    ModelServiceSession,
    RuntimeRequest,
    SessionStateClient,
    SessionStateError,
    SessionStateInput,
    TenantScope,
)

DEFAULT_URL = "http://127.0.0.1:8080"

# What a new session starts from: how the model runs, and its anchors. The evidence is
# the model service's own configuration; sessionstate keeps only its digests.
TEMPLATE = SessionStateInput.model_validate(
    {
        "runtime_profile": {
            "task_profile": "general",
            "model_id": "echo-1",
            "tokenizer": "utf8-bytes",
            "context_window": 4096,
            "max_tokens": 256,
            "streaming": False,
        },
        "memory_anchors": [{"anchor_id": "memory:style", "evidence": "answers briefly"}],
        "gene_anchors": [{"anchor_id": "gene:echo", "evidence": "echo model, no tools"}],
        "routing_evidence": [{"anchor_id": "route:chat", "evidence": "small talk"}],
        "source_trace_ids": ["trace:examples/model_service"],
    }
)


def echo_model(request: RuntimeRequest) -> str:
    """The "model": says the prompt back, with what it was given besides."""
    return (
        f"echo: {request.prompt} "
        f"[{len(request.retrieval_inputs)} memory, {len(request.routing_inputs)} routing, "
        f"{len(request.gene_inputs)} gene inputs; {request.history_turns} turns before]"
    )


class EchoModelService:
    """One conversation of the echo model, its state kept in sessionstate.

    With a `service_token`, `client`'s own token is not used: the session's token is
    exchanged from the service token (a bot's, for the session's workspace).
    """

    def __init__(
        self, client: SessionStateClient, scope: TenantScope, *, service_token: str | None = None
    ) -> None:
        self.session = (
            ModelServiceSession(client, scope, TEMPLATE)
            if service_token is None
            else ModelServiceSession.for_service(client, service_token, scope, TEMPLATE)
        )
        self.transcript: list[tuple[str, str]] = []  # step 5: raw text stays here
        self.last_commit: CommitResult | None = None

    def reply(self, prompt: str) -> str:
        self.session.load()  # 1. load (or start) the state
        preview = self.session.replay()  # 2. replay preview from digests
        request = self.session.runtime_request(prompt, preview)  # 3. local, never sent
        answer = echo_model(request)
        self.last_commit = self.session.commit_turns(  # 4. sanitized turns, if allowed
            [self.session.turn("user", prompt), self.session.turn("assistant", answer)]
        )
        self.transcript.append((prompt, answer))
        return answer


class AsyncEchoModelService:
    """`EchoModelService` as an asyncio program: the same five steps, each awaited."""

    def __init__(
        self,
        client: AsyncSessionStateClient,
        scope: TenantScope,
        *,
        service_token: str | None = None,
    ) -> None:
        self.session = (
            AsyncModelServiceSession(client, scope, TEMPLATE)
            if service_token is None
            else AsyncModelServiceSession.for_service(client, service_token, scope, TEMPLATE)
        )
        self.transcript: list[tuple[str, str]] = []
        self.last_commit: CommitResult | None = None

    async def reply(self, prompt: str) -> str:
        await self.session.load()  # 1.
        preview = await self.session.replay()  # 2.
        request = self.session.runtime_request(prompt, preview)  # 3. local, never sent
        answer = echo_model(request)
        self.last_commit = await self.session.commit_turns(  # 4.
            [self.session.turn("user", prompt), self.session.turn("assistant", answer)]
        )
        self.transcript.append((prompt, answer))
        return answer


def chat(prompts: Sequence[str], *, base_url: str, token: str, scope: TenantScope) -> list[str]:
    """The echo model's replies to prompts, one conversation, its state in sessionstate."""
    with SessionStateClient(base_url, token) as client:
        service = EchoModelService(client, scope)
        replies = []
        for prompt in prompts:
            replies.append(service.reply(prompt))
            print(describe(service.last_commit), file=sys.stderr)
        return replies


async def chat_async(
    prompts: Sequence[str], *, base_url: str, token: str, scope: TenantScope
) -> list[str]:
    """`chat` with the asyncio client."""
    async with AsyncSessionStateClient(base_url, token) as client:
        service = AsyncEchoModelService(client, scope)
        replies = []
        for prompt in prompts:
            replies.append(await service.reply(prompt))
            print(describe(service.last_commit), file=sys.stderr)
        return replies


def bot(
    prompts: Sequence[str], *, base_url: str, token: str, scopes: Sequence[TenantScope]
) -> list[str]:
    """A bot over several sessions with one service token: each prompt to every session in
    turn, over one client; `session: reply` lines."""
    with SessionStateClient(base_url, None) as client:
        services = [EchoModelService(client, scope, service_token=token) for scope in scopes]
        replies = []
        for prompt in prompts:
            for scope, service in zip(scopes, services, strict=True):
                replies.append(f"{scope.session_id}: {service.reply(prompt)}")
                print(f"{scope.session_id}: {describe(service.last_commit)}", file=sys.stderr)
        return replies


async def bot_async(
    prompts: Sequence[str], *, base_url: str, token: str, scopes: Sequence[TenantScope]
) -> list[str]:
    """`bot` with the asyncio client: the sessions of each prompt answered concurrently."""
    async with AsyncSessionStateClient(base_url, None) as client:
        services = [AsyncEchoModelService(client, scope, service_token=token) for scope in scopes]
        replies = []
        for prompt in prompts:
            answers = await asyncio.gather(*(service.reply(prompt) for service in services))
            for scope, service, answer in zip(scopes, services, answers, strict=True):
                replies.append(f"{scope.session_id}: {answer}")
                print(f"{scope.session_id}: {describe(service.last_commit)}", file=sys.stderr)
        return replies


def describe(commit: CommitResult | None) -> str:
    if commit is None:
        return "state: untouched"
    turns = len(commit.record.turns)
    if commit.applied:
        compacted = commit.record.summary.count
        return f"state: stored {commit.state_digest} ({turns} turns kept, {compacted} compacted)"
    return f"state: preview-only ({turns} turns held); blocked: {', '.join(commit.blocked_reasons)}"


def scope_of(token: str, args: argparse.Namespace, session: str | None = None) -> TenantScope:
    """The scope from the flags (or the bot's session), else from the token's own claims
    (read, not verified)."""
    claims = claims_of(token)
    return TenantScope(
        tenant_id=args.tenant or claims.get("tenant"),
        workspace_id=args.workspace or claims.get("workspace"),
        session_id=session or args.session or claims.get("session"),
    )


def claims_of(token: str) -> dict[str, object]:
    """A JWT's claims, read and NOT verified (the service verifies; this only names the scope)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", nargs="*", help="the prompts; none: one a line from stdin")
    parser.add_argument(
        "--url",
        default=os.environ.get("SESSIONSTATE_URL", DEFAULT_URL),
        help=f"the service (default: SESSIONSTATE_URL, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("SESSIONSTATE_TOKEN"),
        help="a model-service token (default: SESSIONSTATE_TOKEN, which keeps it out of `ps`)",
    )
    for level in ("tenant", "workspace", "session"):
        parser.add_argument(f"--{level}", help=f"the {level} id (default: the token's claim)")
    parser.add_argument(
        "--sessions",
        help="serve these sessions (comma-separated ids) as a bot, with --token a service "
        "token of their tenant and workspace, exchanged for each session's own",
    )
    parser.add_argument("--asyncio", action="store_true", help="use the asyncio client and session")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("a model-service token is needed: --token or SESSIONSTATE_TOKEN")
    try:
        scopes = [
            scope_of(args.token, args, session)
            for session in (args.sessions.split(",") if args.sessions else [None])
        ]
    except ValueError:  # pydantic's ValidationError is one; it names no value
        parser.error("no scope: give --tenant, --workspace and --session, or a scoped token")
    prompts = args.prompts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    (scope,) = scopes[:1]
    try:
        if args.sessions and args.asyncio:
            replies = asyncio.run(
                bot_async(prompts, base_url=args.url, token=args.token, scopes=scopes)
            )
        elif args.sessions:
            replies = bot(prompts, base_url=args.url, token=args.token, scopes=scopes)
        elif args.asyncio:
            replies = asyncio.run(
                chat_async(prompts, base_url=args.url, token=args.token, scope=scope)
            )
        else:
            replies = chat(prompts, base_url=args.url, token=args.token, scope=scope)
    except SessionStateError as error:  # its message names status and reason, nothing else
        print(f"sessionstate: {error}", file=sys.stderr)
        return 1
    for reply in replies:
        print(reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
