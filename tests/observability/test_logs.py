"""Log lines are JSON objects (python-json-logger) holding only the listed fields; the
PostgreSQL driver's lines too, without the driver's filled-in message.

The records are made as the loggers make them (psycopg_pool's own call shape for a failed
connect), and formatted by the handlers `configure_logging` installs."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import psycopg
import pytest

from service.observability.logs import DRIVER_LOGGERS, JsonFormatter, configure_logging

SECRET_HOST = "db-host-never-shown.example"


def _record(name: str, msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def _formatted(record: logging.LogRecord) -> dict[str, object]:
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None and not logger.handlers:  # the handler of its configured parent
        logger = logger.parent
    assert logger is not None
    (handler,) = [h for h in logger.handlers if isinstance(h.formatter, JsonFormatter)]
    line = handler.format(record)
    assert "\n" not in line and SECRET_HOST not in line
    parsed: dict[str, object] = json.loads(line)
    return parsed


@pytest.fixture(autouse=True)
def configured() -> Iterator[None]:
    """`configure_logging` as the served process runs it, undone after: other tests of this
    process read these loggers through pytest's capture (they propagate)."""
    loggers = [logging.getLogger(name) for name in ("sessionstate", "service", *DRIVER_LOGGERS)]
    kept = [(logger.handlers[:], logger.level, logger.propagate) for logger in loggers]
    configure_logging()
    yield
    for logger, (handlers, level, propagate) in zip(loggers, kept, strict=True):
        logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate


def test_our_lines_hold_only_the_listed_fields() -> None:
    record = _record(
        "sessionstate.decisions", "log_witness_refused", chain="acme", body=SECRET_HOST
    )
    assert _formatted(record) == {
        "ts": _formatted(record)["ts"],
        "level": "warning",
        "logger": "sessionstate.decisions",
        "event": "log_witness_refused",
        "chain": "acme",
    }


@pytest.mark.parametrize(
    ("said", "failure"),
    [
        ('FATAL:  password authentication failed for user "u"', "authentication_failed"),
        ('FATAL:  database "d" does not exist', "database_unknown"),
        ("session is read-only", "read_only"),
        ("Connection refused", "unreachable"),
    ],
)
def test_a_failed_connect_of_the_pool_is_a_json_line_naming_the_failure(
    said: str, failure: str
) -> None:
    error = psycopg.OperationalError(f'connection to server at "{SECRET_HOST}" failed: {said}')
    record = _record("psycopg.pool", "error connecting in %r: %s", "sessionstate", error)
    logged = _formatted(record)
    assert (logged["event"], logged["failure"]) == ("store_connect_failed", failure)
    assert "detail" not in logged


def test_other_driver_lines_keep_the_template_not_its_arguments() -> None:
    record = _record("psycopg", "rolling back returned connection: %s", SECRET_HOST)
    logged = _formatted(record)
    assert (logged["event"], logged["detail"]) == (
        "store_driver_log",
        "rolling back returned connection: %s",
    )
    assert all(logging.getLogger(name).propagate is False for name in DRIVER_LOGGERS)
