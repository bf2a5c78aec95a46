"""Structured JSON logs: one line a request, ids and outcomes only.

Log lines carry the route template (never the path with its ids filled in),
the request id, actor sub, decision id and status: no body, no token, no
header value, no stored byte.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

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
)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for field in FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                line[field] = value
        return json.dumps(line, separators=(",", ":"))


def configure_logging(level: int = logging.INFO) -> None:
    """JSON lines on stderr for the service's own loggers."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("sessionstate", "service"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False
