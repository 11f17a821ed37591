"""Structured logs: one JSON object per line on stderr, through the logging module.

Call sites pass structured data as ``extra={"fields": {...}}``; the formatter
merges it into the line. Nothing here ever formats a Settings object, so secrets
(SecretStr fields) cannot leak into logs; URLs of services are logged as
host:port only (:func:`safe_address`).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import urlsplit

_HANDLER_NAME = "rankstream-json"


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "msg": ..., **fields}``."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                line.setdefault(key, value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def setup_json_logging(level: int | str = logging.INFO, stream: TextIO | None = None) -> None:
    """Route the ``rankstream`` loggers to JSON lines on ``stream`` (stderr). Idempotent."""
    logger = logging.getLogger("rankstream")
    logger.setLevel(level)
    for handler in logger.handlers:
        if handler.get_name() == _HANDLER_NAME:
            return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.propagate = False
    # kafka-python is chatty at INFO (every connection); keep its warnings only.
    logging.getLogger("kafka").setLevel(logging.WARNING)


def safe_address(url: str) -> str:
    """``host:port`` of a service URL, dropping any user name and password."""
    parts = urlsplit(url if "://" in url else f"tcp://{url}")
    host = parts.hostname or "?"
    return f"{host}:{parts.port}" if parts.port else host
