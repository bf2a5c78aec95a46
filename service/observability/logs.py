"""Structured JSON logs (python-json-logger): one line a request, ids and outcomes only,
and the PostgreSQL driver's lines in the same form.

Log lines carry the route template (never the path with its ids filled in),
the request id, actor sub, decision id and status: no body, no token, no
header value, no stored byte.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

import psycopg
from pythonjsonlogger import json as json_logger

from store.backends.postgres_failures import connect_failure

DRIVER_LOGGERS = ("psycopg", "psycopg.pool")

FIELDS = (
    "request_id",
    "method",
    "route",
    "status",
    "duration_ms",
    "actor",
    "decision_id",
    "allow",
    "reason",
    "error_type",
    "exit_code",
    "restart_in_s",
    "key_digest",
    "pruned",
    "seq",
    "error_digest",
    "dropped_bytes",
    "summaries",
    "policy_revision",
    "outcome",
    "deciding",
    "errors",
    "reasons",
    "chain",
    "problem",
    "serial",
    "highest_serial",
    "policy_set",
    "approvals",
    "witness",
    "tree_size",
    "signed",
    "why",  # which check a timestamp failed (log_timestamp_failed): a code, never a body
    "failure",  # why the driver could not connect (store_connect_failed): a StoreFailure
    "detail",  # the driver's message template (store_driver_log), never its arguments
    "worker",  # a worker's slot (worker_started, worker_died)
    "pid",
    "workers",  # how many workers stopped (workers_stopped)
)


class JsonFormatter(json_logger.JsonFormatter):
    """One compact JSON object a line (python-json-logger): the time, level, logger and
    event, then only the `FIELDS` a record carries. Nothing else of a record is shown: no
    exception text, no stack, no extra outside the list."""

    def __init__(self) -> None:
        super().__init__(json_serializer=_compact)

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data.update(
            ts=datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            level=record.levelname.lower(),
            logger=record.name,
            event=self.event(record),
        )
        for field in FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                log_data[field] = value

    def event(self, record: logging.LogRecord) -> str:
        return record.getMessage()


class DriverJsonFormatter(JsonFormatter):
    """The PostgreSQL driver's own lines (psycopg and its pool), as JSON: a failed connect
    is `store_connect_failed` with its `failure` (`StoreFailure`: the login refused, no such
    database, a standby, unreachable), anything else `store_driver_log` with the message's
    template (`detail`). The driver's filled-in message, which names hosts, users and
    databases, is never shown."""

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        errors = [arg for arg in _args(record) if isinstance(arg, psycopg.Error)]
        if errors and str(record.msg).startswith("error connecting"):
            log_data["failure"] = connect_failure(errors[0]).name.lower()
        else:
            log_data["detail"] = str(record.msg)

    def event(self, record: logging.LogRecord) -> str:
        if str(record.msg).startswith("error connecting"):
            return "store_connect_failed"
        return "store_driver_log"


def _args(record: logging.LogRecord) -> tuple[object, ...]:
    args = record.args
    return args if isinstance(args, tuple) else ()


def _compact(value: object, **options: Any) -> str:
    return json.dumps(value, separators=(",", ":"), **options)


def configure_logging(level: int = logging.INFO) -> None:
    """JSON lines on stderr for the service's own loggers, and for the PostgreSQL driver's
    (warnings and above: its pool's reconnects during an outage)."""
    ours = logging.StreamHandler(sys.stderr)
    ours.setFormatter(JsonFormatter())
    driver = logging.StreamHandler(sys.stderr)
    driver.setFormatter(DriverJsonFormatter())
    for names, handler, at in (
        (("sessionstate", "service"), ours, level),
        (DRIVER_LOGGERS, driver, max(level, logging.WARNING)),
    ):
        for name in names:
            logger = logging.getLogger(name)
            logger.handlers[:] = [handler]
            logger.setLevel(at)
            logger.propagate = False
