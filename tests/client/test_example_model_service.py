"""examples/model_service.py against the real `sessionstate serve`: state advances, no prompt stays.

Both flavours: the sync client (`EchoModelService`, `chat`) and the asyncio one
(`AsyncEchoModelService`, `chat_async`, the command line's `--asyncio`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sessionstate_client import AsyncSessionStateClient, NotFound, SessionStateClient
from sessionstate_client.models import SessionStateRecord, TenantScope

from examples.model_service import AsyncEchoModelService, EchoModelService, chat, chat_async
from service.auth.tokens import mint_token
from tests.support.live import JWT_SECRET
from tests.support.served import ROOT, Served, start

SCOPE = TenantScope(tenant_id="tenant-a", workspace_id="ws-1", session_id="chat-1")
FLAVOURS = ["sync", "asyncio"]


def token(role: str) -> str:
    session = role == "model-service"
    return mint_token(
        JWT_SECRET.encode(),
        sub="example",
        roles=[role],
        tenant="tenant-a",
        workspace="ws-1" if session else None,
        session="chat-1" if session else None,
        ttl_seconds=600,
    )


def stored(client: SessionStateClient) -> SessionStateRecord | None:
    try:
        return client.get_state(SCOPE).read_report.record
    except NotFound:
        return None


def stop(served: Served) -> bytes:
    """SIGTERM the service; then every byte it left: the data dir's files and its log."""
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(20) == 0
    files = [path for path in served.data_dir.rglob("*") if path.is_file()]
    assert any(path.suffix == ".log" for path in files)  # LevelDB's write-ahead log is there
    return b"".join(path.read_bytes() for path in files) + served.log.read_bytes()


def replies_of(flavour: str, url: str, prompts: list[str]) -> list[str]:
    """The example model service's replies in one conversation, in-process, by flavour."""
    if flavour == "sync":
        with SessionStateClient(url, token("model-service")) as client:
            service = EchoModelService(client, SCOPE)
            return [service.reply(prompt) for prompt in prompts]

    async def conversation() -> list[str]:
        async with AsyncSessionStateClient(url, token("model-service")) as client:
            service = AsyncEchoModelService(client, SCOPE)
            return [await service.reply(prompt) for prompt in prompts]

    return asyncio.run(conversation())


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_chat_stores_two_turn_digests_a_turn_and_no_prompt(served: Served, flavour: str) -> None:
    canaries = [f"PROMPT-CANARY-{uuid.uuid4().hex}" for _ in range(4)]
    with SessionStateClient(served.url, token("operator")) as operator:
        operator.grant_approval("tenant-a", "ws-1", {"ttl_seconds": 600, "reason": "example"})
    with SessionStateClient(served.url, token("model-service")) as client:
        digests: list[str] = []
        for turn, canary in enumerate(canaries[:3], start=1):
            (reply,) = replies_of(flavour, served.url, [f"tell me about {canary}"])
            assert canary in reply  # the model saw the prompt
            assert f"{2 * (turn - 1)} turns before" in reply  # a new process resumes the state
            record = stored(client)
            assert record is not None
            assert len(record.turns) == 2 * turn
            assert [t.role for t in record.turns[-2:]] == ["user", "assistant"]
            assert record.state_digest not in digests
            digests.append(record.state_digest)
        # The command line, from the environment, goes on with the same conversation.
        env = {
            **os.environ,
            "SESSIONSTATE_URL": served.url,
            "SESSIONSTATE_TOKEN": token("model-service"),
        }
        flags = ["--asyncio"] if flavour == "asyncio" else []
        cli = subprocess.run(
            [sys.executable, "examples/model_service.py", *flags, f"and {canaries[3]}?"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert f"echo: and {canaries[3]}?" in cli.stdout
        assert "6 turns before" in cli.stdout
        assert "state: stored sha256:" in cli.stderr
        record = stored(client)
        assert record is not None and len(record.turns) == 8
    left_behind = stop(served)
    assert record.turns[-1].turn_id.encode() in left_behind  # the scan does see stored bytes
    for canary in canaries:
        assert canary.encode() not in left_behind


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_without_an_approval_the_chat_goes_on_preview_only(served: Served, flavour: str) -> None:
    canary = f"PROMPT-CANARY-{uuid.uuid4().hex}"
    prompts = [f"first {canary}", "second"]
    url, svc = served.url, token("model-service")
    if flavour == "sync":
        replies = chat(prompts, base_url=url, token=svc, scope=SCOPE)
    else:
        replies = asyncio.run(chat_async(prompts, base_url=url, token=svc, scope=SCOPE))
    assert replies[0].startswith(f"echo: first {canary}")
    assert "2 turns before" in replies[1]  # the turns were held, as digests
    with SessionStateClient(served.url, token("model-service")) as client:
        assert stored(client) is None
    assert canary.encode() not in stop(served)


@pytest.mark.slow
def test_a_2000_exchange_chat_runs_to_the_end(opa_bin: str, tmp_path: Path) -> None:
    """Past the old 1,024-turn cap, with durable writes: a small window keeps the run short."""
    served = start(opa_bin, tmp_path / "var", tmp_path, {"SESSIONSTATE_MAX_TURNS_KEPT": "16"})
    try:
        with SessionStateClient(served.url, token("operator")) as operator:
            operator.grant_approval("tenant-a", "ws-1", {"ttl_seconds": 600, "reason": "long"})
        env = {
            **os.environ,
            "SESSIONSTATE_URL": served.url,
            "SESSIONSTATE_TOKEN": token("model-service"),
        }
        cli = subprocess.run(
            [sys.executable, "examples/model_service.py"],
            input="".join(f"message {n}\n" for n in range(2000)),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        replies = cli.stdout.splitlines()
        assert len(replies) == 2000
        assert replies[-1].startswith("echo: message 1999 ")
        assert replies[-1].endswith("3998 turns before]")
        states = cli.stderr.splitlines()
        assert len(states) == 2000 and all(line.startswith("state: stored ") for line in states)
        assert states[-1].endswith("(16 turns kept, 3984 compacted)")
        with SessionStateClient(served.url, token("model-service")) as client:
            record = stored(client)
        assert record is not None and len(record.turns) == 16
        assert record.summary.count + len(record.turns) == 4000
    finally:
        stop(served)


def bot_token() -> str:
    """One service token of tenant-a's ws-1, with no session: a bot's."""
    return mint_token(
        JWT_SECRET.encode(),
        sub="example-bot",
        roles=["model-service"],
        tenant="tenant-a",
        workspace="ws-1",
        ttl_seconds=600,
    )


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_bot_serves_three_sessions_with_one_service_token(served: Served, flavour: str) -> None:
    sessions = ["user-1", "user-2", "user-3"]
    with SessionStateClient(served.url, token("operator")) as operator:
        operator.grant_approval("tenant-a", "ws-1", {"ttl_seconds": 600, "reason": "bot"})
    env = {**os.environ, "SESSIONSTATE_URL": served.url, "SESSIONSTATE_TOKEN": bot_token()}
    flags = ["--asyncio"] if flavour == "asyncio" else []
    command = [sys.executable, "examples/model_service.py", *flags]
    cli = subprocess.run(
        [*command, "--sessions", ",".join(sessions), "hello", "again"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    replies = cli.stdout.splitlines()
    assert [line.split(":", 1)[0] for line in replies] == sessions * 2
    assert all("echo: again" in line and "2 turns before" in line for line in replies[3:])
    assert cli.stderr.count("state: stored sha256:") == 6

    auditor = mint_token(
        JWT_SECRET.encode(), sub="au", roles=["auditor"], tenant="tenant-a", ttl_seconds=600
    )
    with SessionStateClient(served.url, auditor) as reviewer:
        exchanges = list(reviewer.iter_decisions(action="token.exchange"))
        writes = list(reviewer.iter_decisions(action="write"))
    # One exchange a session (each token lives 15 minutes), every one by the bot.
    assert sorted(entry.target.session_id or "" for entry in exchanges) == sessions
    assert all(entry.decision.allow and entry.actor.sub == "example-bot" for entry in exchanges)
    assert sorted(entry.target.session_id or "" for entry in writes) == sorted(sessions * 2)
    assert all(entry.actor.session_id in sessions for entry in writes)
    with SessionStateClient(served.url, None) as client:
        for session in sessions:
            scope = TenantScope(tenant_id="tenant-a", workspace_id="ws-1", session_id=session)
            own = client.with_token(client.exchange_token(bot_token(), scope).access_token)
            record = own.get_state(scope).read_report.record
            assert record is not None and len(record.turns) == 4
