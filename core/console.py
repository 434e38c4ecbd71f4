"""What a run shows a user: headway's own lines at INFO, other libraries' at WARNING, and
figures at the end of a run to four significant digits (the files keep full precision)."""

from __future__ import annotations

import logging
import math
import sys
from typing import Any, TextIO

HEADWAY_LOGGER = "headway"
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
# Flower's HTTP client (Flower 1.39's runtime API) logs every request at INFO; in a deployment the
# ServerApp's output is uploaded by such requests, so each upload printed a line that was uploaded again
HTTP_CLIENT_LOGGERS = ("httpx", "httpcore")
DIGITS = 4


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is when a record comes (Flower swaps or wraps it to
    upload a deployed app's output), not the stream of the moment the handler was made."""

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ sets it: the property wins
        pass


def quiet_http_clients() -> None:
    """Flower's HTTP client loggers at WARNING, unless someone set them higher already."""
    for name in HTTP_CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level < logging.WARNING:  # NOTSET included: it would inherit the root's level
            logger.setLevel(logging.WARNING)


def show_headway_log(level: int = logging.INFO) -> None:
    """headway's lines on stderr at ``level`` or below it where it was set lower already (once per process), without lowering the root
    logger's level: ``logging.basicConfig(level=INFO)`` would print every library's INFO (and
    Flower's DEBUG, which reaches the root's handler too). Records still propagate, so a
    handler the caller put on the root (pytest's, say) sees them as well."""
    logger = logging.getLogger(HEADWAY_LOGGER)
    if logger.level == logging.NOTSET or logger.level > level:  # never above a level set lower (--verbose's DEBUG)
        logger.setLevel(level)
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logger.addHandler(handler)
    quiet_http_clients()


def significant(value: Any, digits: int = DIGITS) -> Any:
    """``value`` with every float (in dicts and lists too) rounded to ``digits`` significant
    digits, for printing: 0.9722222222222222 -> 0.9722; ints, strings and non-finite floats as they are."""
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: significant(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [significant(v, digits) for v in value]
    return value


def figure(value: float | None, digits: int = DIGITS) -> str:
    """A figure for a log line: ``digits`` significant digits, "none" where there is none."""
    return "none" if value is None else f"{value:.{digits}g}"


def score(value: float | None) -> str:
    """An accuracy (or R²) for a log line: 4 decimals, as the round lines print them
    (1 -> "1.0000", 0.675 -> "0.6750"); "none" where there is none."""
    return "none" if value is None else f"{value:.{DIGITS}f}"


def plural(count: int, word: str) -> str:
    """``count`` and ``word``, with an s unless the count is one: "1 round", "2 rounds"."""
    return f"{count} {word}{'' if count == 1 else 's'}"
