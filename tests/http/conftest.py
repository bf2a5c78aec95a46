"""Fixtures the HTTP tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.policy.sidecar import OpaSidecar
from tests.support.live import LiveService, live_service, service_settings


@pytest.fixture
def on_postgres(
    sidecar: OpaSidecar, tmp_path: Path, postgres_conninfo: str
) -> Iterator[LiveService]:
    """The service, in process, with its lanes on the test PostgreSQL database."""
    settings = service_settings(tmp_path / "var", store=postgres_conninfo)
    with live_service(sidecar, settings) as live:
        yield live
