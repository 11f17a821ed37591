"""The one exception root of rankstream.

Every error the project raises on purpose derives from :class:`RankstreamError`.
Library errors (kafka-python, redis-py, pydantic, OS errors) are translated at the
edges with ``raise ... from exc`` so callers catch one family and the CLI can turn
any of them into a one-line message with exit code 2.
"""

from __future__ import annotations


class RankstreamError(Exception):
    """Root of every error rankstream raises on purpose."""


def os_error_text(exc: OSError) -> str:
    """An OSError as one line: its reason and the path it names (``Not a directory:
    /x/s``), without errno's ``[Errno 20]``."""
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


class ConvergenceError(RankstreamError):
    """An iterative solver hit ``max_iter`` before reaching its tolerance.

    Unconverged scores are never returned as if they had converged: the solver
    raises this instead, carrying what it reached so a caller can log it.
    """

    def __init__(self, message: str, *, iterations: int, error: float) -> None:
        super().__init__(message)
        self.iterations = iterations
        self.error = error


class InputError(RankstreamError):
    """Bad input: a malformed edge line or event, an unknown option, a missing file.

    ``where`` names the file and line (``edges.tsv:17``) when there is one.
    """

    def __init__(self, message: str, *, where: str | None = None) -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where


class ConfigError(RankstreamError):
    """Settings that cannot work together (a bad URL, a negative size, ...)."""


class ServiceError(RankstreamError):
    """Kafka or Redis could not be reached or answered with an error."""


class ServiceUnavailable(ServiceError):
    """A service is down or unreachable; retrying later may succeed."""
