"""No file of the repository refers to a path outside it: a reader who clones it has
only what it holds. Every `../` reference in every file is resolved from that file's
directory and must stay inside the repository; the project's former outside documents
are not named at all."""

from __future__ import annotations

import os
import re
import subprocess

from tests.support.paths import ROOT

# `../` not preceded by a dot (an ellipsis such as `.../approvals` is no path), then
# the rest of the path up to a delimiter.
RELATIVE = re.compile(r"(?<![.\w])((?:\.\./)+[^\s'\"`()\[\]<>,;*]*)")
# Written apart, so that this file does not name them either.
OUTSIDE = [
    re.compile(pattern)
    for pattern in (
        r"\bshared" + r"/(?:API|STYLE)\.md",
        r"\bshared" + r"/spec/",
        r"\.\./" + r"shared\b",
        r"/work" + r"/(?:main|shared|wt-)",
    )
]


def repository_files() -> list[str]:
    """Tracked files and new ones not ignored, as the working tree has them."""
    done = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=30,
    )
    return sorted({name for name in done.stdout.decode().split("\0") if name})


def texts() -> list[tuple[str, str]]:
    found = []
    for name in repository_files():
        path = ROOT / name
        if not path.is_file() or path.is_symlink():
            continue
        try:
            found.append((name, path.read_text()))
        except UnicodeDecodeError:  # binary: no path to read
            continue
    return found


def leaves_the_repository(name: str, reference: str) -> bool:
    resolved = os.path.normpath(os.path.join(ROOT, os.path.dirname(name), reference))
    return not (resolved == str(ROOT) or resolved.startswith(str(ROOT) + os.sep))


def test_no_relative_reference_leaves_the_repository() -> None:
    escaping = [
        f"{name}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(1)}"
        for name, text in texts()
        for match in RELATIVE.finditer(text)
        if leaves_the_repository(name, match.group(1))
    ]
    assert not escaping, "\n".join(escaping)


def test_no_file_names_the_documents_outside_the_repository() -> None:
    named = [
        f"{name}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}"
        for name, text in texts()
        for pattern in OUTSIDE
        for match in pattern.finditer(text)
    ]
    assert not named, "\n".join(named)


def test_the_check_itself_catches_what_it_must() -> None:
    up, shared = "../", "shared"  # written apart, so that this file passes its own checks
    assert leaves_the_repository("README.md", f"{up}{shared}/API.md")
    assert leaves_the_repository("docs/api.md", f"{up}{up}{shared}/spec/x.md")
    assert not leaves_the_repository("docs/api.md", f"{up}README.md")
    assert not leaves_the_repository("service/http/ui.py", f"{up}templates")
    assert not RELATIVE.search(f"`POST .{up}approvals`")
    assert any(pattern.search(f"see {up}{shared} for it") for pattern in OUTSIDE)
    assert any(pattern.search(f"{shared}/API.md's table") for pattern in OUTSIDE)
