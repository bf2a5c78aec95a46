"""Followed literally, every doc works: its shell and Python samples run as pasted.

A fenced block whose info string starts with `sh`, `bash`, `shell`, `python`
or `py` is a sample; one that also says `fragment` (```sh fragment) is not run
(docker, placeholders, `make test` itself). A ```text output block that is the
next block after a sample is what that sample prints: its standard output must
be exactly that, or the test fails (so a recipe that says "it prints True" does).
A ```sh offline block is for a stopped service's data dir (the offline review
commands): it runs after the page's other samples, against a service of the
page's own, once that is stopped, with `SESSIONSTATE_DATA_DIR=var` (`make
run`'s) read as its data dir. The samples of one document run in order, in one bash process, against a real `sessionstate serve` (its OPA
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
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.support.served import ROOT, Served, start

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"sh", "bash", "shell"}
OFFLINE_DATA_DIR = "SESSIONSTATE_DATA_DIR=var"  # how an offline sample names the data dir
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
    output: str | None = None  # what it must print (the ```text output block after it)

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


def samples(doc: Path, kind: str = "online") -> list[Sample]:
    """A doc's samples of one kind: run against the live service (`online`), against its data
    dir once it is stopped (```sh offline), or never (`fragment`)."""
    found: list[Sample] = []
    follows: Sample | None = None  # the sample the previous block was, if it was one
    for line, info, body in blocks(doc):
        words = info.split()
        if words == ["text", "output"] and follows is not None:
            found[-1] = replace(follows, output=body)
        follows = None
        if not words or _kind(words) != kind:
            continue
        if words[0] in SHELL:
            follows = Sample(doc, line, "sh", body)
        elif words[0] in PYTHON:
            follows = Sample(doc, line, "python", body)
        if follows is not None:
            found.append(follows)
    return found


def test_every_block_that_looks_like_a_command_says_what_it_is() -> None:
    unmarked = [
        f"{doc.relative_to(ROOT)}:{line}"
        for doc in DOCS
        for line, info, body in blocks(doc)
        if not info and COMMANDISH.match(body)
    ]
    assert unmarked == [], "mark these blocks ```sh, ```sh fragment or ```text"


def _kind(words: list[str]) -> str:
    return next((word for word in ("fragment", "offline") if word in words), "online")


def script(doc_samples: list[Sample], port: int, data_dir: Path | None = None) -> str:
    """One bash script of a doc's samples, each announced on stderr for the failure report.
    The docs' port becomes the test's, and an offline sample's data dir the stopped one's."""
    parts = ["set -euo pipefail"]
    for sample in doc_samples:
        code = sample.code.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        if data_dir is not None:
            code = code.replace(OFFLINE_DATA_DIR, f"SESSIONSTATE_DATA_DIR={data_dir}")
        parts.append(f"echo {shlex.quote('::sample ' + sample.where)} >&2")
        if sample.language == "python":
            code = f".venv/bin/python - <<'SESSIONSTATE_SAMPLE'\n{code}SESSIONSTATE_SAMPLE\n"
        if sample.output is None:
            parts.append(code)
            continue
        # In this shell (a variable it sets is there for the next sample), its output kept.
        parts.append(f"{{\n{code}}} > .sample-output\ncat .sample-output")
        expected = f"<<'SESSIONSTATE_OUTPUT'\n{sample.output}SESSIONSTATE_OUTPUT"
        parts.append(f"diff -u - .sample-output {expected}\n")
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
    checkout = checkout_view(tmp_path / "checkout")
    run_samples(script(samples(doc), port), reader_env(docs_service), checkout)


OFFLINE_DOCS = [doc for doc in DOCS if samples(doc, "offline")]


@pytest.mark.slow
@pytest.mark.parametrize("doc", OFFLINE_DOCS, ids=[doc.name for doc in OFFLINE_DOCS])
def test_the_offline_samples_of_a_doc_run_on_the_stopped_service(
    doc: Path, opa_bin: str, tmp_path: Path
) -> None:
    """A page's samples against a service of its own, then, once it is stopped, its offline
    samples (```sh offline) on that data dir, in the same directory (they use what the
    page's samples kept, e.g. a checkpoint), as a reviewer with the data dir would."""
    served = start(opa_bin, tmp_path / "var", tmp_path)
    port = int(served.url.rsplit(":", 1)[1])
    env = reader_env(served)
    checkout = checkout_view(tmp_path / "checkout")
    try:
        run_samples(script(samples(doc), port), env, checkout)
    finally:
        served.process.terminate()
        served.process.wait(20)
    run_samples(script(samples(doc, "offline"), port, served.data_dir), env, checkout)


def reader_env(served: Served) -> dict[str, str]:
    """The shell of a reader who started the service as `served` was: its settings."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("SESSIONSTATE_") or key == "SESSIONSTATE_OPA_BIN"
    }
    env |= {
        "SESSIONSTATE_DATA_DIR": str(served.data_dir),
        "SESSIONSTATE_PORT": served.url.rsplit(":", 1)[1],
        "SESSIONSTATE_DURABLE_WRITES": "true",
    }
    served_env = _served_env(served)
    return env | {
        key: value for key, value in served_env.items() if key.startswith("SESSIONSTATE_")
    }


def run_samples(code: str, env: dict[str, str], where: Path) -> None:
    """Run a samples script in `where`, a checkout view."""
    done = subprocess.run(
        ["bash", "-c", code],
        cwd=where,
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
