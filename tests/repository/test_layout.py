"""The README's Layout table names every package of the server and the store, and no two
of their modules share a name unless one re-exports the other."""

from __future__ import annotations

import re
from collections import defaultdict

from tests.support.paths import ROOT

ROOMS = ("service", "store")


def layout_paths() -> set[str]:
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)`", table, flags=re.M))


def packages() -> list[str]:
    found = []
    for room in ROOMS:
        for init in sorted((ROOT / room).rglob("__init__.py")):
            found.append(init.parent.relative_to(ROOT).as_posix() + "/")
    return found


def test_every_package_has_a_row_in_the_layout_table() -> None:
    rows = layout_paths()
    missing = [package for package in packages() if package not in rows]
    assert missing == []


def test_no_two_modules_share_a_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for room in ROOMS:
        for module in (ROOT / room).rglob("*.py"):
            if module.name != "__init__.py":
                by_name[module.name].append(module.relative_to(ROOT).as_posix())
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert shared == {}
