"""docs/api.md states the contract the code serves: its generated tables are fresh, and
its prose names the headers, patterns and models the code uses."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

from service.api import v1 as contract
from service.api.openapi import OPERATIONS
from service.config.settings import Settings, variable
from service.http.body import MAX_BODY_BYTES
from store.scope import SCOPE_ID_PATTERN
from tests.support.paths import ROOT

DOC = ROOT / "docs" / "api.md"


def api_doc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("api_doc", ROOT / "scripts" / "api_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_tables_are_the_code_s() -> None:
    text = DOC.read_text()
    assert api_doc().rendered(text) == text, "run .venv/bin/python scripts/api_doc.py"


def test_every_operation_and_its_models_are_in_the_doc() -> None:
    text = DOC.read_text()
    for op in OPERATIONS:
        shown = op.path.replace(contract.SESSION, "S")
        assert f"`{op.method.upper()} {shown}`" in text, op
        for model in (op.body, op.out, op.query):
            if model is not None and model.__name__ not in {"DecisionQuery", "VerifyQuery"}:
                assert f"`{model.__name__}`" in text, model


def test_every_header_of_the_contract_is_in_the_header_table() -> None:
    text = DOC.read_text()
    headers = [
        value
        for name, value in vars(contract).items()
        if name.isupper() and isinstance(value, str) and re.fullmatch(r"[A-Z][A-Za-z-]+", value)
    ]
    assert "ETag" in headers and "Retry-After" in headers
    for header in headers:
        assert f"| `{header}` |" in text, header


def test_the_prose_states_the_patterns_and_limits_the_code_enforces() -> None:
    text = DOC.read_text()
    assert f"`{SCOPE_ID_PATTERN}`" in text
    assert MAX_BODY_BYTES == 1024 * 1024 and "over 1 MiB" in text
    assert f"`{contract.DOCS}`" in text and f"`{contract.OPENAPI}`" in text
    for name in Settings.model_fields:
        assert f"`{variable(name)}`" in text


def test_the_readme_and_the_docs_point_at_the_contract() -> None:
    assert "docs/api.md" in (ROOT / "README.md").read_text()
