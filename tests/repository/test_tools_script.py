"""scripts/tools.sh: a tool already built, or on PATH at the pinned version, is used as it is.

The version check once piped `opa version` into `grep -q` under pipefail, and
failed at random (grep exits at its match; OPA, still writing, dies of SIGPIPE):
`make run` then rebuilt OPA, or, with no Go, gave up. Each case here runs the
script many times in a sandbox: a copy of the script in a temporary project,
a PATH holding only what the case names, and a stand-in `go` that records each
call and builds nothing (so a wrong decision shows, and never builds for real).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.paths import ROOT

SCRIPT = ROOT / "scripts" / "tools.sh"
RUNS = 200


def pinned(name: str) -> str:
    match = re.search(rf"^{name}_VERSION=(\S+)$", SCRIPT.read_text(), re.MULTILINE)
    assert match, f"scripts/tools.sh no longer pins {name}_VERSION"
    return match.group(1)


# A stand-in for `go install`: records its arguments; for compose it leaves a binary
# named `cmd` in GOBIN (the name go install gives it), printing the pinned version.
FAKE_GO = """#!{bash}
echo "$*" >> "{calls}"
case "$*" in
  *github.com/docker/compose/v2/cmd@*)
    printf '#!{bash}\\necho "Docker Compose version v{compose}"\\n' > "$GOBIN/cmd"
    {chmod} +x "$GOBIN/cmd"; exit 0 ;;
esac
exit 1
"""


@dataclass
class Sandbox:
    project: Path
    path_dir: Path
    go_calls: Path

    @property
    def tools_bin(self) -> Path:
        return self.project / ".tools" / "bin"

    def add_go(self) -> None:
        go = self.path_dir / "go"
        go.write_text(
            FAKE_GO.format(
                bash=shutil.which("bash"),
                chmod=shutil.which("chmod"),
                calls=self.go_calls,
                compose=pinned("COMPOSE"),
            )
        )
        go.chmod(0o755)

    def fake_tool(self, where: Path, name: str, output: str) -> Path:
        """An executable whose `version` prints `output` (from a file, by cat)."""
        where.mkdir(parents=True, exist_ok=True)
        text = where / f"{name}.version"
        text.write_text(output)
        tool = where / name
        tool.write_text(f'#!{shutil.which("bash")}\nexec {shutil.which("cat")} "{text}"\n')
        tool.chmod(0o755)
        return tool

    def run(self, tool: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.project / "scripts" / "tools.sh"), tool],
            env={"PATH": str(self.path_dir), "HOME": str(self.project)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def runs(self, tool: str, times: int = RUNS) -> set[tuple[int, str, str]]:
        """The distinct (exit code, stdout, stderr) of `times` runs."""
        return {
            (done.returncode, done.stdout, done.stderr)
            for done in (self.run(tool) for _ in range(times))
        }

    def go_was_called(self) -> bool:
        return self.go_calls.exists()


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    shutil.copy2(SCRIPT, project / "scripts" / "tools.sh")
    path_dir = tmp_path / "path"
    path_dir.mkdir()
    # Only what the script itself needs: no go, no opa, unless a case adds them.
    for command in ("bash", "dirname", "grep", "mktemp", "mkdir", "mv", "rm"):
        found = shutil.which(command)
        assert found, command
        (path_dir / command).symlink_to(found)
    return Sandbox(project, path_dir, tmp_path / "go-calls")


def link_opa(where: Path, opa_bin: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "opa").symlink_to(Path(opa_bin).resolve())
    return where / "opa"


def test_a_built_opa_is_used_every_time_and_never_rebuilt(sandbox: Sandbox, opa_bin: str) -> None:
    built = link_opa(sandbox.tools_bin, opa_bin)
    sandbox.add_go()
    assert sandbox.runs("opa") == {(0, f"{built}\n", "")}
    assert not sandbox.go_was_called()


def test_an_opa_on_path_at_the_pinned_version_is_used_every_time_without_go(
    sandbox: Sandbox, opa_bin: str, tmp_path: Path
) -> None:
    on_path = link_opa(tmp_path / "opa-dir", opa_bin)
    (sandbox.path_dir / "opa").symlink_to(on_path)
    assert sandbox.runs("opa") == {(0, f"{sandbox.path_dir / 'opa'}\n", "")}


def test_a_tool_writing_more_after_its_version_line_still_counts(
    sandbox: Sandbox,
) -> None:
    """The old `| grep -q` lost this every time: the tool is still writing when grep exits."""
    chatty = "Version: {}\n" + "Platform: linux/amd64\n" * 50_000  # about 1 MiB
    sandbox.fake_tool(sandbox.path_dir, "opa", chatty.format(pinned("OPA")))
    built = sandbox.fake_tool(sandbox.tools_bin, "regal", chatty.format("v" + pinned("REGAL")))
    sandbox.add_go()
    assert sandbox.runs("opa", 20) == {(0, f"{sandbox.path_dir / 'opa'}\n", "")}
    assert sandbox.runs("regal", 20) == {(0, f"{built}\n", "")}
    assert not sandbox.go_was_called()


def test_an_opa_at_another_version_is_not_used(sandbox: Sandbox, opa_bin: str) -> None:
    other = pinned("OPA") + "1"  # 1.22.31: the pinned version as a prefix is not it
    sandbox.fake_tool(sandbox.path_dir, "opa", f"Version: {other}\n")
    done = sandbox.run("opa")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "tools.sh: Go is needed to build opa (https://go.dev/dl)\n"
    built = link_opa(sandbox.tools_bin, opa_bin)
    assert sandbox.runs("opa", 20) == {(0, f"{built}\n", "")}


def test_compose_is_built_once_under_its_own_name(sandbox: Sandbox) -> None:
    sandbox.add_go()
    first = sandbox.run("compose")
    installed = sandbox.tools_bin / "docker-compose"
    assert first.returncode == 0, first.stderr
    assert first.stdout == f"{installed}\n"
    assert "building docker compose" in first.stderr
    (call,) = sandbox.go_calls.read_text().splitlines()
    assert call.startswith("install ")
    assert call.endswith(f" github.com/docker/compose/v2/cmd@v{pinned('COMPOSE')}")
    assert sorted(p.name for p in sandbox.tools_bin.iterdir()) == ["docker-compose"]
    sandbox.go_calls.unlink()
    assert sandbox.runs("compose", 50) == {(0, f"{installed}\n", "")}
    assert not sandbox.go_was_called()


def test_an_unknown_tool_is_a_usage_error(sandbox: Sandbox) -> None:
    done = sandbox.run("docker")
    assert done.returncode == 2
    assert done.stderr == (
        "usage: scripts/tools.sh opa|regal|compose|litewitness|witnessctl|logcheck|kustomize\n"
    )


@pytest.mark.parametrize("tool", ["litewitness", "witnessctl", "logcheck", "kustomize"])
def test_a_built_witness_tool_or_logcheck_is_not_rebuilt(tool: str) -> None:
    """The real script over the real .tools: the torchwood binaries and kustomize are told
    by their build info (`go version -m`), logcheck by its sources' hash, so a second run (the
    first may build) finds the tool and builds nothing."""
    first = subprocess.run([str(SCRIPT), tool], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    again = subprocess.run([str(SCRIPT), tool], capture_output=True, text=True, timeout=60)
    assert (again.returncode, again.stdout, again.stderr) == (0, first.stdout, "")
    assert first.stdout == f"{ROOT / '.tools' / 'bin' / tool}\n"
