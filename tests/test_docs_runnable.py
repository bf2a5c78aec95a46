"""Followed literally, every doc works: its shell and Python samples run as pasted.

A fenced block whose info string starts with `sh`, `bash`, `shell`, `python`
or `py` is a sample; one that also says `fragment` (```sh fragment) is not run
(docker, placeholders, `make test` itself). The samples of one document run in
order, in one bash process, against a real `sessionstate serve` (its OPA
sidecar, LevelDB), from a directory that looks like the repository root (a
link to each of its entries, so files a sample writes land there and not in
the checkout), with the environment a reader who started the service that way
would have. The only rewrite is the port: the docs say 127.0.0.1:8080, the
test serves on a free port.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.served import ROOT, Served, start

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"sh", "bash", "shell"}
PYTHON = {"python", "py"}
FENCE = re.compile(r"^( {0,4})```([^\n`]*)\n(.*?)^\1```[ \t]*$", re.DOTALL | re.MULTILINE)
# A plain block that looks like a command must say what it is (sample, fragment, or text).
COMMANDISH = re.compile(
    r"^\s*(\$ |curl |\.venv/|make |sessionstate |docker |python3? |export |[A-Z_]+=)"
)


@dataclass(frozen=True)
class Sample:
    doc: Path
    line: int
    language: str  # "sh" or "python"
    code: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path) -> Iterator[tuple[int, str, str]]:
    """(line, info string, body) of every fenced block, list-item indentation removed."""
    text = doc.read_text()
    for match in FENCE.finditer(text):
        indent = len(match.group(1))
        body = "".join(line[indent:] for line in match.group(3).splitlines(keepends=True))
        yield text.count("\n", 0, match.start()) + 1, match.group(2).strip(), body


def samples(doc: Path) -> list[Sample]:
    found = []
    for line, info, body in blocks(doc):
        words = info.split()
        if not words or "fragment" in words:
            continue
        if words[0] in SHELL:
            found.append(Sample(doc, line, "sh", body))
        elif words[0] in PYTHON:
            found.append(Sample(doc, line, "python", body))
    return found


def test_every_block_that_looks_like_a_command_says_what_it_is() -> None:
    unmarked = [
        f"{doc.relative_to(ROOT)}:{line}"
        for doc in DOCS
        for line, info, body in blocks(doc)
        if not info and COMMANDISH.match(body)
    ]
    assert unmarked == [], "mark these blocks ```sh, ```sh fragment or ```text"


def script(doc_samples: list[Sample], port: int) -> str:
    """One bash script of a doc's samples, each announced on stderr for the failure report."""
    parts = ["set -euo pipefail"]
    for sample in doc_samples:
        code = sample.code.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        parts.append(f"echo {shlex.quote('::sample ' + sample.where)} >&2")
        if sample.language == "sh":
            parts.append(code)
        else:
            parts.append(f".venv/bin/python - <<'SESSIONSTATE_SAMPLE'\n{code}SESSIONSTATE_SAMPLE")
    return "\n".join(parts) + "\n"


@pytest.fixture(scope="module")
def docs_service(opa_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("docs")
    running = start(opa_bin, tmp / "var", tmp)
    yield running
    if running.process.poll() is None:
        running.process.terminate()
        running.process.wait(20)


RUNNABLE_DOCS = [doc for doc in DOCS if samples(doc)]


def checkout_view(where: Path) -> Path:
    """A directory holding a link to every top-level entry of the checkout."""
    where.mkdir()
    for entry in ROOT.iterdir():
        if entry.name != ".git":
            (where / entry.name).symlink_to(entry)
    return where


@pytest.mark.parametrize("doc", RUNNABLE_DOCS, ids=[doc.name for doc in RUNNABLE_DOCS])
def test_the_samples_of_a_doc_run_as_pasted(
    doc: Path, docs_service: Served, tmp_path: Path
) -> None:
    port = int(docs_service.url.rsplit(":", 1)[1])
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("SESSIONSTATE_") or key == "SESSIONSTATE_OPA_BIN"
    }
    # The reader's shell: the same settings the service was started with.
    env |= {
        "SESSIONSTATE_DATA_DIR": str(docs_service.data_dir),
        "SESSIONSTATE_PORT": str(port),
        "SESSIONSTATE_DURABLE_WRITES": "true",
    }
    served_env = _served_env(docs_service)
    env |= {key: value for key, value in served_env.items() if key.startswith("SESSIONSTATE_")}
    done = subprocess.run(
        ["bash", "-c", script(samples(doc), port)],
        cwd=checkout_view(tmp_path / "checkout"),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        announced = re.findall(r"^::sample (.*)$", done.stderr, re.MULTILINE)
        failing = announced[-1] if announced else "before the first sample"
        pytest.fail(
            f"{failing} failed (exit {done.returncode}):\n"
            f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-2000:]}"
        )


def _served_env(served: Served) -> dict[str, str]:
    """The environment the served process was started with (its secrets among them)."""
    raw = Path(f"/proc/{served.process.pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(): value.decode() for key, value in pairs}
