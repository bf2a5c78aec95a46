"""The walk-through `sessionstate serve --walkthrough` prints, pasted as it is into a new shell.

The reader's new shell has none of the service's environment. So a service
started with a data dir (or a token lifetime) other than the default must
print those settings with its commands, or the tokens they mint are refused.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.cli.walkthrough import walkthrough
from service.config.settings import Settings
from tests.support.served import ROOT, Served, start

LAST_LINE = "# Stop with Ctrl-C"


def printed_walkthrough(served: Served) -> str:
    """The walk-through from the service's output (printed just after it starts listening)."""
    deadline = time.monotonic() + 30
    while LAST_LINE not in (text := served.log.read_text()):
        assert time.monotonic() < deadline, text[-3000:]
        time.sleep(0.05)
    start = text.index("Paste these into another shell")
    return text[start : text.index("\n", text.index(LAST_LINE))]


def pasted_commands(text: str) -> list[str]:
    """The lines a reader pastes: every indented line that is not a comment."""
    return [
        line.strip()
        for line in text.splitlines()
        if line.startswith("  ") and line.strip() and not line.strip().startswith("#")
    ]


def run_pasted(commands: list[str], tmp_path: Path, cwd: Path = ROOT) -> list[str]:
    """Run the commands in one bash, as pasted, in a shell without SESSIONSTATE_ settings.

    Returns each command's output. `cd` to the directory the service was started in,
    as the walk-through says; HOME is elsewhere, so nothing else is read from there.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONSTATE_")}
    env["HOME"] = str(tmp_path)
    script = "".join(
        f"printf '\\n::output {index}\\n'\n{command}\n" for index, command in enumerate(commands)
    )
    done = subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    outputs = re.split(r"^::output \d+\n", done.stdout, flags=re.MULTILINE)[1:]
    assert len(outputs) == len(commands), done.stdout
    return [output.strip() for output in outputs]


def answer_of(commands: list[str], outputs: list[str], fragment: str) -> str:
    (found,) = [out for cmd, out in zip(commands, outputs, strict=True) if fragment in cmd]
    return found


@pytest.fixture(params=[True, False], ids=["writes-on", "writes-off"])
def served_elsewhere(
    request: pytest.FixtureRequest, opa_bin: str, tmp_path: Path
) -> Iterator[Served]:
    """A service on a data dir that is not ./var, its own secrets, a shorter token lifetime."""
    settings = {
        "SESSIONSTATE_DURABLE_WRITES": "true" if request.param else "false",
        "SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS": "1800",
    }
    running = start(opa_bin, tmp_path / "elsewhere" / "data", tmp_path, settings, env_secrets=False)
    yield running
    if running.process.poll() is None:
        os.killpg(running.process.pid, signal.SIGTERM)
        running.process.wait(30)


def test_the_printed_walkthrough_works_as_pasted_with_another_data_dir(
    served_elsewhere: Served, tmp_path: Path
) -> None:
    text = printed_walkthrough(served_elsewhere)
    commands = pasted_commands(text)
    data_dir = served_elsewhere.data_dir.resolve()
    assert commands[0] == (
        f"export SESSIONSTATE_DATA_DIR={data_dir} SESSIONSTATE_JWT_MAX_LIFETIME_SECONDS=1800"
    )
    writes_on = "durable writes: on" in served_elsewhere.log.read_text()
    outputs = run_pasted(commands, tmp_path)

    preview = json.loads(answer_of(commands, outputs, "/state/preview"))
    assert "reason" not in preview, preview  # a 401 would be a problem with a reason
    assert preview["decision"]["allow"] is True
    assert "borrow checker" not in json.dumps(preview)
    assert "hmac-sha256:" in json.dumps(preview["record"])

    approval = json.loads(answer_of(commands, outputs, "/approvals"))
    assert approval["approval"]["reason"] == "walkthrough"

    written = answer_of(commands, outputs, "-X PUT")
    read = json.loads(answer_of(commands, outputs, "curl -s http"))
    replay = json.loads(answer_of(commands, outputs, "/replay-preview"))
    if writes_on:
        assert written.startswith("HTTP/1.1 201"), written
        assert read["read_report"]["record"] is not None, read
        assert replay["preview"]["allowed"] is True, replay
    else:
        assert written.startswith("HTTP/1.1 403"), written
        assert '"reason":"session_state_durable_writes_disabled"' in written.replace(" ", "")
        assert read["reason"] == "session_state_not_found", read


@pytest.fixture
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SESSIONSTATE_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("no_settings")
def test_the_default_settings_print_no_environment() -> None:
    text = walkthrough(Settings())
    assert "export" not in text and "SESSIONSTATE_DATA_DIR" not in text


@pytest.mark.usefixtures("no_settings")
def test_a_secret_from_the_environment_is_named_never_printed() -> None:
    secret = "a-secret-that-must-stay-out-of-the-output-0123456789"
    text = walkthrough(Settings(jwt_secret=secret))
    assert secret not in text
    assert "SESSIONSTATE_JWT_SECRET" in text
