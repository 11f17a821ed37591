"""The one settings object, read once at the entry point.

Every value can be set by an environment variable prefixed ``RANKSTREAM_``
(``RANKSTREAM_REDIS_URL``, ``RANKSTREAM_KAFKA_BOOTSTRAP``, ...) or a ``.env`` file.
Only the two entry points call :func:`load_settings`: :func:`rankstream.cli.main`
and ``python -m rankstream.services`` (what ``./run`` calls). Library code takes
explicit arguments and never reads ``os.environ``. A ``RANKSTREAM_`` name that no
setting has is an error in ``.env`` and a warning in the environment, where other
tools put names too (``RANKSTREAM_SOAK_*`` aside: the soak test's).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from rankstream.errors import ConfigError

ENV_FILE = Path(".env")  # read from the working directory, as pydantic-settings does
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")  # RFC 3986, section 3.1 (lower-cased)
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")  # Kafka's rule (and not "." or "..")
ENV_PREFIX = "RANKSTREAM_"
# Read by the soak test's harness, not settings (docs/reliability.md).
_NOT_SETTINGS_PREFIX = "RANKSTREAM_SOAK_"


def _check_host(host: str) -> None:
    """ValueError for a host name no resolver can be asked about: an empty label
    (``a..b``) or one over 63 characters failed inside ``getaddrinfo`` as a
    UnicodeError, a traceback in every command that connects."""
    try:
        host.encode("idna")
    except UnicodeError:
        raise ValueError(f"bad host name {host!r} (an empty label, or one longer than "
                         "63 characters)") from None


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "rankstream"


class Settings(BaseSettings):
    """Everything an operator may tune. Field docs are the reference."""

    model_config = SettingsConfigDict(
        env_prefix="RANKSTREAM_", env_file=ENV_FILE, extra="ignore", frozen=True
    )

    # --- Kafka -----------------------------------------------------------------
    kafka_bootstrap: str = Field("127.0.0.1:9092", description="host:port[,host:port]")
    topic: str = Field("rankstream.links", description="topic carrying link events")
    dlq_topic: str = Field("rankstream.links.dlq", description="dead-letter topic")
    # Kafka's wire type for a partition count is int32: above it kafka-python's
    # request encoding failed with a traceback. The broker judges what fits below.
    topic_partitions: int = Field(4, ge=1, le=2**31 - 1)
    group_id: str = Field("rankstream-consumer", description="consumer group (lag only)")
    # kafka-python's four protocols, and the SASL mechanisms that a username and
    # password are enough for: anything else failed inside kafka-python with an
    # AssertionError or a KeyError instead of a setting named.
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT")
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None

    # --- Redis -----------------------------------------------------------------
    redis_url: str = Field("redis://127.0.0.1:6379/0")
    redis_username: str | None = None
    redis_password: SecretStr | None = None
    redis_ssl_ca_certs: Path | None = None
    key_prefix: str = Field("rs:", description="every Redis key lives under this prefix")

    # --- Ranking ---------------------------------------------------------------
    damping: float = Field(0.85, gt=0.0, lt=1.0)
    tolerance: float = Field(
        1e-6,
        ge=1e-12,  # ranker.bounds.MIN_TOLERANCE (not imported: settings load without numba)
        lt=1.0,  # a relative L1 bound of 1 or more certifies nothing (ranker.incremental)
        description="relative certified bound: scores are fresh when the L1 error bound "
        "||r||_1/(1-d) on y is at most tolerance * sum(y); on x = y/sum(y) the L1 error "
        "is then at most about twice the tolerance",
    )
    publish_threshold: float = Field(
        1e-7, ge=0.0, allow_inf_nan=False,
        description="write a page's score only if it moved by more than this (smaller "
        "moves too, largest first, when they alone exceed the publication's error budget)"
    )
    publish_max_updates: int = Field(
        10_000, ge=0,
        description="at most this many score updates per algorithm per publication, the "
        "largest moves first (new pages always); keeps publications short on a growing "
        "graph; the rest is in the published bound and written next; 0: no cap",
    )
    max_iter: int = Field(1000, ge=1)
    # A quarter of a sweep. Session 5 measured that more sweeps per batch did not pay: on
    # the 1M-page stream's latency phase (1.4M pages, 50k link changes/s) a cap of 1
    # gave event -> visible p50/p99 5.1/6.5 s, a cap of 3 gave 5.2-8.4 / 7.8-15.2 s.
    # Session 6 spends the capped work on the largest residuals first
    # (ranker.refresh.PRIORITY_START); on 1.4M pages with 25k new links per batch a
    # quarter of a sweep refreshes both algorithms in 0.55 s per batch against 1.15 s
    # for a whole one, leaving a PageRank bound of 5-7e-3 relative against 8e-4. In
    # the pipeline that bound stays below what the publication cap leaves unwritten
    # (published bounds ~5e-2 either way), and p50/p99 went from 3.2/4.7 s (cap 1) to
    # 2.8-3.3 / 3.7-4.0 s (cap 0.25, two runs). Idle and final refreshes are uncapped.
    batch_max_sweeps: float = Field(
        0.25, ge=0.0, allow_inf_nan=False,
        description="the work of the consumer's refresh after a batch, in sweeps' worth "
        "of link visits per algorithm, spent on the largest residuals first (the scores "
        "are then published with the bound reached; refreshes while idle go on to the "
        "tolerance); bounds the time from event to published score on large graphs; "
        "fractions allowed; 0: no cap (max_iter)",
    )

    # One: measured on the 1M-page stream's latency phase (broker, Redis, load producer
    # and consumer on this 2-core machine), two runs back to back: with both cores the
    # refresh's parallel passes fought Kafka, Redis and the main thread for them, and
    # event -> visible p50/p99 was 3.1/4.6 s; serial, 2.4/3.2 s (WPR refresh median
    # 0.35 -> 0.33 s, and the consumer then refreshed after every batch), throughput
    # 85.6k -> 89.0k link changes/s.
    ranker_threads: int = Field(
        1, ge=1,
        description="threads for the parallel passes of the consumer's refreshes (numba); "
        "1 suits a machine whose cores Kafka and Redis share; loading the mirror "
        "uses every core regardless",
    )

    # --- Consumer --------------------------------------------------------------
    batch_max_events: int = Field(5000, ge=1)
    poll_timeout_ms: int = Field(200, ge=1)

    # --- Input limits (violations go to the DLQ with the reason) --------------
    max_url_length: int = Field(8192, ge=16)
    max_links_per_page: int = Field(10_000, ge=1)
    # At most 64 MiB: a link event is kilobytes, and every record may be fetched and
    # buffered whole (topic limit 2x this, consumer.kafka_source.receive_max_bytes).
    max_message_bytes: int = Field(1_048_576, ge=1024, le=64 * 1024 * 1024)
    # NoDecode: the environment may give "http,https" as well as a JSON list; the
    # validators below parse both, and a typo is a one-line ConfigError either way.
    allowed_schemes: Annotated[tuple[str, ...], NoDecode] = Field(
        ("http", "https", "file"),
        description="URL schemes events may use: comma-separated or a JSON list",
    )

    # --- Restart snapshots (consumer.snapshot) ----------------------------------
    snapshot_dir: Path | None = Field(
        default_factory=lambda: _default_cache_dir() / "snapshots",
        description="where a consumer that stops cleanly leaves its graph and scores, "
        "so that the next start on this machine skips reading them from Redis when "
        "Redis has not changed since; empty: no snapshots",
    )

    @field_validator("damping")
    @classmethod
    def _damping_leaves_a_tolerance(cls, value: float) -> float:
        # Else the error named RANKSTREAM_TOLERANCE, which nobody set ("at damping 1").
        if not 1e-12 * 0.15 / (1.0 - value) < 1.0:
            raise ValueError(f"{value!r} is too close to 1: float64 cannot certify any "
                             "relative tolerance below 1 there")
        return value

    @field_validator("tolerance")
    @classmethod
    def _tolerance_above_the_floor(cls, value: float, info: ValidationInfo) -> float:
        # ranker.bounds.tolerance_floor(damping), written out because settings load
        # without numba (tests/unit/test_rank_command.py checks the two agree): near
        # d = 1 the floor grows, and the consumer would only fail at its first refresh.
        damping = info.data.get("damping")
        if damping is not None:
            floor = 1e-12 * max(1.0, 0.15 / (1.0 - damping))
            if value < floor:
                raise ValueError(f"must be at least {floor:.3g} at damping {damping!r} "
                                 "(below it the residual is float64 rounding noise)")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        # redis-py only finds a bad port when it connects (a traceback in
        # `./run services`), and takes "redis://host/x" as database 0.
        url = urlsplit(value)
        if url.scheme not in {"redis", "rediss", "unix"}:
            raise ValueError("must be redis://host:port/db, rediss://... or unix:///path")
        if url.scheme == "unix":
            return value
        # No part of the URL is quoted back: a password holding '/', '#' or '?' ends
        # up in what urlsplit calls the port or the path.
        advice = "(percent-encode '/', '#', '?' and '@' in the password)"
        try:
            url.port  # noqa: B018 (urlsplit checks the port only when asked for it)
        except ValueError:
            raise ValueError(f"bad port {advice}") from None
        if not url.hostname:
            raise ValueError("no host (redis://host:port/db)")
        _check_host(url.hostname)
        db = url.path.strip("/")
        if db and not db.isdigit():
            raise ValueError(f"the database must be a number {advice}")
        return value

    @field_validator("kafka_bootstrap", "topic", "dlq_topic", "group_id",
                     "kafka_sasl_username", "kafka_sasl_password", "redis_url",
                     "redis_username", "redis_password", "key_prefix", "allowed_schemes",
                     mode="before")
    @classmethod
    def _text_is_utf8(cls, value: object) -> object:
        # Non-UTF-8 bytes in an environment variable reach Python as lone surrogates,
        # which a str field took and every Redis or Kafka call then failed to encode
        # (a traceback from `rankstream status` with such a key prefix). Not the
        # paths: a directory name need not be UTF-8, and Python handles such paths.
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("not valid UTF-8 text") from None
        return value

    @field_validator("topic", "dlq_topic")
    @classmethod
    def _topic_name(cls, value: str) -> str:
        # Kafka's rule, checked here and not by the first call to a broker (which
        # `rankstream produce` waited 30 s for when none answered).
        if not _TOPIC.fullmatch(value) or value in {".", ".."}:
            raise ValueError(f"not a Kafka topic name: {value!r} (1-249 characters of "
                             "A-Z a-z 0-9 . _ -)")
        return value

    @field_validator("key_prefix")
    @classmethod
    def _prefix_beside_others(cls, value: str) -> str:
        # Another deployment's text index keys are "{its prefix}term:{word}": under a
        # prefix "rs:term:", our "lock", "graph" and "offsets" keys were its postings
        # of those words (WRONGTYPE inside a transaction, half of it applied).
        if "term" in value.split(":")[:-1]:
            raise ValueError(f"{value!r} has a 'term' segment, which another deployment's "
                             "text index (P term:WORD) would share")
        return value

    @model_validator(mode="after")
    def _dead_letters_elsewhere(self) -> Settings:
        if self.topic == self.dlq_topic:
            # Each dead letter would be read back as an event, fail again, and be sent
            # again, for ever.
            raise ValueError(f"RANKSTREAM_TOPIC and RANKSTREAM_DLQ_TOPIC must differ (both "
                             f"{self.topic!r})")
        return self

    @model_validator(mode="before")
    @classmethod
    def _credentials_out_of_the_url(cls, data: Any) -> Any:
        """Move a username and password given in ``redis_url`` into their own settings.

        Why: the password then lives only in the SecretStr (masked in ``repr`` and never
        printed); in the URL it showed in ``repr(settings)`` and ``rankstream services
        env``. As with redis-py's own reading of a URL, credentials in the URL win (an
        empty password, which redis-py ignores, leaves the setting's). Only the userinfo
        (``redis://user:password@host``, also ``rediss://`` and ``unix://``) is moved: a
        ``?password=`` query parameter, which redis-py also reads, stays in the URL.
        """
        if not isinstance(data, dict) or not isinstance(data.get("redis_url"), str):
            return data
        url = urlsplit(data["redis_url"])
        if url.scheme not in {"redis", "rediss", "unix"} or "@" not in url.netloc:
            return data
        userinfo = url.netloc.rpartition("@")[0]
        username, _, password = userinfo.partition(":")
        start = data["redis_url"].index("//") + 2  # the netloc, which starts "userinfo@"
        rest = data["redis_url"][start + len(userinfo) + 1:]
        data = {**data, "redis_url": data["redis_url"][:start] + rest}
        if username:
            data["redis_username"] = unquote(username)
        if password:  # redis-py ignores an empty one too
            data["redis_password"] = unquote(password)
        return data

    @model_validator(mode="after")
    def _sasl_is_complete(self) -> Settings:
        # kafka-python took SASL without a mechanism, or SCRAM without a user, and
        # failed when connecting with a KeyError or AttributeError: a traceback.
        sasl = self.kafka_security_protocol.startswith("SASL_")
        if sasl and (self.kafka_sasl_mechanism is None or not self.kafka_sasl_username
                     or self.kafka_sasl_password is None):
            raise ValueError(f"RANKSTREAM_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol}"
                             " needs RANKSTREAM_KAFKA_SASL_MECHANISM, _SASL_USERNAME and "
                             "_SASL_PASSWORD")
        if not sasl and self.kafka_sasl_mechanism is not None:
            raise ValueError("RANKSTREAM_KAFKA_SASL_MECHANISM needs a SASL_PLAINTEXT or "
                             "SASL_SSL RANKSTREAM_KAFKA_SECURITY_PROTOCOL")
        return self

    @model_validator(mode="after")
    def _ca_certs_need_tls(self) -> Settings:
        # redis-py passed the CA file to a plain or unix-socket connection, which
        # refused the keyword with a TypeError (a traceback) in every command.
        if self.redis_ssl_ca_certs is not None and not self.redis_url.startswith("rediss://"):
            raise ValueError("RANKSTREAM_REDIS_SSL_CA_CERTS needs a rediss:// "
                             "RANKSTREAM_REDIS_URL (TLS)")
        return self

    @field_validator("kafka_bootstrap")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        for server in value.split(","):
            host, colon, port = server.strip().rpartition(":")
            if not (colon and host and port.isdigit() and 0 < int(port) < 65536):
                raise ValueError(f"expected host:port[,host:port...], got {server.strip()!r}")
            _check_host(host.removeprefix("[").removesuffix("]"))
        return value

    @field_validator("allowed_schemes", mode="before")
    @classmethod
    def _scheme_list(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON list ({exc.msg}); or give http,https") from exc
            except RecursionError as exc:  # "[[[[..." nested past the parser's limit
                raise ValueError("not a JSON list (nested too deeply)") from exc
        return text.split(",")

    @field_validator("allowed_schemes")
    @classmethod
    def _check_schemes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # An empty list would send every event to the dead-letter topic.
        schemes = tuple(scheme.strip().lower() for scheme in value)
        if not schemes or not all(schemes):
            raise ValueError("give at least one scheme, e.g. http,https (no empty entries)")
        for scheme in schemes:
            if not _SCHEME.fullmatch(scheme):
                raise ValueError(f"not a URL scheme: {scheme!r}")
        return schemes

    @field_validator("snapshot_dir", "kafka_ssl_cafile", "redis_ssl_ca_certs", mode="before")
    @classmethod
    def _empty_means_none(cls, value: object) -> object:
        # Blank too: " " was a relative directory named by a space. An empty path was
        # Path("."): a compose file's `RANKSTREAM_REDIS_SSL_CA_CERTS=${CA:-}` asked for
        # TLS and failed every command, and an empty CA file was handed to Kafka as ".".
        return None if isinstance(value, str) and not value.strip() else value

    # --- Local services (./run services) --------------------------------------
    cache_dir: Path = Field(default_factory=_default_cache_dir, description=(
        "downloads kept between runs (Kafka's jars), outside the repo"))
    state_dir: Path = Field(default_factory=lambda: _default_cache_dir() / "state",
                            description="the local broker's and redis-server's data and "
                                        "logs; the broker's controller listens on the "
                                        "Kafka port + 1")

    @field_validator("cache_dir", "state_dir", mode="before")
    @classmethod
    def _not_empty(cls, value: object) -> object:
        # An empty path is Path("."): the jars or the services' data in whatever
        # directory the command ran from.
        if isinstance(value, str) and not value.strip():
            raise ValueError("empty: unset it for the default, or name a directory")
        return value


def _check_env_file(path: Path = ENV_FILE) -> None:
    """ConfigError naming the first line of ``.env`` that python-dotenv cannot parse.

    pydantic-settings reads the file with python-dotenv, which skips such a line with
    a warning of its own and goes on: ``RANKSTREAM_DAMPING="0.5`` (a quote left open)
    ranked at the default 0.85 and exited 0. The line itself is not shown: it may
    hold a password. A missing file or a non-file (a FIFO) is left to the reader.
    """
    from dotenv.parser import parse_stream

    if not path.is_file():
        return
    with path.open(encoding="utf-8") as stream:
        for binding in parse_stream(stream):
            if binding.error:
                raise ConfigError(f"cannot read the .env file: line {binding.original.line} "
                                  "is not NAME=value (an unclosed quote?)")
            if binding.key is None or not binding.key.upper().startswith(ENV_PREFIX):
                continue  # another tool's line: a bare NAME is python-dotenv syntax too
            if binding.value is None:
                # RANKSTREAM_DAMPING:0.5 parses as a name without a value, which
                # pydantic-settings ignored as silently as a bad line.
                raise ConfigError(f"cannot read the .env file: line {binding.original.line} "
                                  "is not NAME=value")
            unknown = _unknown_setting(binding.key)
            if unknown:
                raise ConfigError(f"{unknown} in the .env file")


def _unknown_setting(name: str) -> str | None:
    """"unknown setting NAME (did you mean ...?)" for a RANKSTREAM_ name that no setting
    has (a misspelling would otherwise be ignored: RANKSTREAM_DAMPLING=0.5 ranked at
    the default 0.85), else None."""
    import difflib

    upper = name.upper()
    if not upper.startswith(ENV_PREFIX) or upper.startswith(_NOT_SETTINGS_PREFIX):
        return None
    known = [ENV_PREFIX + field.upper() for field in Settings.model_fields]
    if upper in known:
        return None
    close = difflib.get_close_matches(upper, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown setting {name}{hint}"


# Names Kubernetes (and docker --link) put in every pod's environment for a Service:
# one called "rankstream-redis" gives RANKSTREAM_REDIS_SERVICE_HOST and the like.
_SERVICE_LINK = re.compile(r".*_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_(TCP|UDP|SCTP)"
                           r"(_\w+)?)?)")


def _warn_of_unknown_environment() -> None:
    """A warning, not an error, for the environment: other tools put names there that
    a user never chose (a file is the user's own: an error there)."""
    for name in os.environ:
        unknown = _unknown_setting(name)
        if unknown and not _SERVICE_LINK.fullmatch(name.upper()):
            logging.getLogger("rankstream.settings").warning(
                "%s in the environment: ignored", unknown)


def derive_settings(settings: Settings, origin: str, **changes: object) -> Settings:
    """``settings`` with ``changes`` (a command-line override), validated by every
    rule of the settings without reading the environment again.

    ``model_copy(update=...)`` validated nothing: ``produce --topic`` could name the
    dead-letter topic. A bad value is a ConfigError naming ``origin`` (the argument
    the user gave), not a ``RANKSTREAM_`` setting they never set.
    """
    values = {name: getattr(settings, name) for name in type(settings).model_fields}
    try:
        return Settings.model_validate({**values, **changes})
    except ValidationError as exc:
        message = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ConfigError(f"bad {origin}: {message}") from exc


def load_settings(**overrides: object) -> Settings:
    """Read the environment once and validate it; a bad value is a ConfigError."""
    try:
        _warn_of_unknown_environment()
        _check_env_file()
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")  # pydantic's, for our ValueErrors
        if not field:  # a rule across settings: its message names them
            raise ConfigError(f"bad settings: {message}") from exc
        raise ConfigError(f"bad setting RANKSTREAM_{field.upper()}: {message}") from exc
    except SettingsError as exc:
        # pydantic-settings failed to decode a value before validation could see it
        # (a list or dict setting that is not valid JSON).
        named = re.search(r'field "(\w+)"', str(exc))
        field = named.group(1).upper() if named else "?"
        cause = f": {exc.__cause__}" if exc.__cause__ is not None else ""
        raise ConfigError(f"bad setting RANKSTREAM_{field}: cannot parse the value{cause}"
                          ) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read the .env file: not UTF-8 ({exc.reason} at byte "
                          f"{exc.start})") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read the .env file: {exc.strerror or exc}") from exc
