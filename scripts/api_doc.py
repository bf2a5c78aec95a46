"""Write or check the generated tables of docs/api.md, from the code that serves the contract.

Each table sits between `<!-- generated: NAME -->` and `<!-- end generated: NAME -->`:
the endpoints (`service.api.openapi.OPERATIONS`, the document the service serves), every
shape of that document (its `components.schemas`, from the pydantic wire models), the
service's reason codes (`service.api.reasons.Reason`), the codes the default policies can
return (`contains "..."` in policies/**/*.rego), the redacted labels of a corrupt record
(`store.record.blockers.CorruptionLabel`) and the settings (`service.config.settings.Settings`).
Everything else in docs/api.md is prose; tests/api/test_api_doc.py holds it to the code.

    .venv/bin/python scripts/api_doc.py          # rewrite the tables in docs/api.md
    .venv/bin/python scripts/api_doc.py --check  # exit 1 if one is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from service.api.openapi import openapi_document  # noqa: E402
from service.api.reasons import Reason  # noqa: E402
from service.config.settings import Settings, accepted_values, variable  # noqa: E402
from store.record.blockers import CorruptionLabel  # noqa: E402

DOC = ROOT / "docs" / "api.md"
POLICIES = ROOT / "policies"
# Who calls each group of operations under the default policies (the policies decide).
CALLERS = {
    "state": "model-service",
    "token": "model-service",
    "approvals": "operator",
    "sessions": "model-service, operator",
    "workspaces": "operator",
    "decisions": "auditor",
    "ops": "anyone",
}
SCOPE = "/v1/tenants/{tenant_id}/workspaces/{workspace_id}/sessions/{session_id}"


def _code(text: object) -> str:
    return f"`{text}`"


def endpoints() -> list[str]:
    rows = [
        "| method and path | who | success | errors | what |",
        "| --- | --- | --- | --- | --- |",
    ]
    for path, operations in openapi_document()["paths"].items():
        for method, operation in operations.items():
            statuses = sorted(operation["responses"], key=int)
            success = [status for status in statuses if int(status) < 400]
            errors = [status for status in statuses if int(status) >= 400]
            shown = path.replace(SCOPE, "S")
            rows.append(
                f"| `{method.upper()} {shown}` | {CALLERS[operation['tags'][0]]} "
                f"| {', '.join(success)} | {', '.join(errors) or '-'} | {operation['summary']} |"
            )
    return rows


def service_reasons() -> list[str]:
    rows = ["| status | `reason` | detail |", "| --- | --- | --- |"]
    for reason in sorted(Reason, key=lambda reason: (reason.status, reason.value)):
        rows.append(f"| {reason.status} | `{reason.value}` | {reason.detail} |")
    return rows


def policy_codes() -> dict[str, set[str]]:
    """code -> the packages (`sessionstate.<package>`) whose Rego can return it, its own
    codes and those it passes on from a decision it asks (`history` asks `read`'s, `rewind`
    and `fork` `write`'s; a fork keeps its own access codes, `_write_access_reasons`)."""
    own: dict[str, set[str]] = {}
    asks: dict[str, tuple[set[str], set[str]]] = {}  # package -> (asked, codes not passed on)
    for path in sorted(POLICIES.rglob("*.rego")):
        if path.name.endswith("_test.rego"):
            continue
        package = ".".join(path.parent.relative_to(POLICIES).parts)
        text = path.read_text()
        own[package] = set(re.findall(r'contains "([a-z_]+)"', text))
        asked = set(re.findall(r"^import data\.(sessionstate\.[a-z_]+)$", text, re.M))
        kept = re.search(r"^_\w+_access_reasons := \{(.*?)^\}", text, re.M | re.S)
        withheld = set(re.findall(r'"([a-z_]+)"', kept.group(1))) if kept else set()
        asks[package] = (asked - {"sessionstate.lib"}, withheld)
    found: dict[str, set[str]] = {}
    for package in own:
        for code in _returned(package, own, asks):
            found.setdefault(code, set()).add(package)
    return found


def _returned(
    package: str, own: dict[str, set[str]], asks: dict[str, tuple[set[str], set[str]]]
) -> set[str]:
    """The codes a package can return: its own, and what it passes on of those it asks."""
    asked, withheld = asks[package]
    passed = {code for other in asked for code in _returned(other, own, asks)}
    return own[package] | (passed - withheld)


def policy_reasons() -> list[str]:
    rows = ["| code (403, in `decision.reasons`) | returned by |", "| --- | --- |"]
    for code, packages in sorted(policy_codes().items()):
        rows.append(f"| `{code}` | {', '.join(map(_code, sorted(packages)))} |")
    return rows


def _type(schema: dict[str, Any]) -> str:
    """A property's type in a word: a shape's name, a list of one, or the JSON type."""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    options = [_type(option) for option in schema.get("anyOf", []) if option != {"type": "null"}]
    if options:
        nullable = any(option == {"type": "null"} for option in schema["anyOf"])
        return " or ".join(options) + (" or null" if nullable else "")
    if schema.get("type") == "array":
        return f"[{_type(schema.get('items', {}))}]"
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    return str(schema.get("type", "any"))


def shapes() -> list[str]:
    rows = [
        "| shape | fields (`?`: may be absent in a request, or null/absent in an answer) |",
        "| --- | --- |",
    ]
    schemas = openapi_document()["components"]["schemas"]
    for name, schema in sorted(schemas.items()):
        if "enum" in schema:
            fields = "one of " + ", ".join(map(_code, schema["enum"]))
        else:
            required = set(schema.get("required", []))
            fields = "; ".join(
                f"`{field}{'' if field in required else '?'}` {_type(prop)}"
                for field, prop in schema.get("properties", {}).items()
            )
        rows.append(f"| `{name}` | {fields} |")
    return rows


def corruption_labels() -> list[str]:
    return [f"- `{label.value}`" for label in CorruptionLabel]


def settings() -> list[str]:
    rows = ["| variable | accepts | default |", "| --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        if name == "policy_dir":
            default = "a checkout's `policies/`; installed from a wheel, its default policies"
        elif field.default is None:
            default = "unset"
        elif isinstance(field.default, bool):
            default = _code(str(field.default).lower())
        elif isinstance(field.default, Path) and not field.default.is_absolute():
            default = _code(f"./{field.default}")
        else:
            default = _code(field.default)
        rows.append(f"| `{variable(name)}` | {accepted_values(name)} | {default} |")
    return rows


SECTIONS: dict[str, Callable[[], list[str]]] = {
    "endpoints": endpoints,
    "service reasons": service_reasons,
    "policy reasons": policy_reasons,
    "shapes": shapes,
    "corruption labels": corruption_labels,
    "settings": settings,
}


def rendered(text: str) -> str:
    """`text` with every generated section written anew."""
    for name, make in SECTIONS.items():
        start, end = f"<!-- generated: {name} -->", f"<!-- end generated: {name} -->"
        if text.count(start) != 1 or text.count(end) != 1:
            raise SystemExit(f"docs/api.md needs exactly one {start} and one {end}")
        head, rest = text.split(start)
        _, tail = rest.split(end)
        text = head + start + "\n" + "\n".join(make()) + "\n" + end + tail
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table is stale")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    fresh = rendered(text)
    if args.check:
        if fresh != text:
            print("docs/api.md is stale: run .venv/bin/python scripts/api_doc.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
