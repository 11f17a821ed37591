"""The two services together, as the settings describe them: ``up``, ``down``, ``status``.

Whatever already answers at a configured address is reused and never stopped, so
users can point the settings at their own Kafka and Redis. Only what we started
(known by our pid files) is ours to stop.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rankstream.errors import ConfigError, ServiceError, ServiceUnavailable
from rankstream.services import _proc
from rankstream.services.kafka import (
    KafkaBroker,
    TopicSpec,
    ensure_topics,
    kafka_answers,
    kafka_listen_address,
    kafka_pid,
    start_kafka,
    stop_kafka,
    topic_partitions,
)
from rankstream.services.kafka_jars import (
    KAFKA_VERSION,
    fetch_kafka,
    java_binary,
    libs_dir_for,
)
from rankstream.services.redis import (
    AclUser,
    PingState,
    RedisServer,
    listen_address,
    redis_binary,
    redis_pid,
    redis_ping,
    start_redis,
    still_loading_error,
    stop_redis,
    wait_for_redis,
)
from rankstream.settings import Settings

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class LocalServices:
    """Handles on the broker and the Redis instance the settings point at."""

    kafka: KafkaBroker
    redis: RedisServer
    topics: tuple[TopicSpec, ...]
    kafka_options: Mapping[str, Any]
    redis_username: str | None
    redis_tls: bool
    redis_ca_certs: str | None
    state_dir: Path
    cache_dir: Path

    @property
    def lock_file(self) -> Path:
        return self.state_dir / "services.lock"


@dataclass(frozen=True)
class ServiceState:
    """One service as seen by ``status`` and returned by ``up``."""

    name: str
    address: str
    up: bool
    owner: str  # "ours", "external" or "-" (down)
    pid: int | None = None
    detail: str = ""

    def __str__(self) -> str:
        state = "up" if self.up else "down"
        pid = f"pid {self.pid}" if self.pid else "-"
        head = f"{self.name:<6} {state:<5} {self.address:<22} {self.owner:<9} {pid:<10}"
        return f"{head} {self.detail}".rstrip()


def _split_host_port(address: str, default_port: int) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep:
        return address, default_port
    if not port.isdigit():
        raise ConfigError(f"bad port in {address!r}")
    return host.strip("[]"), int(port)


def topic_specs(settings: Settings) -> tuple[TopicSpec, ...]:
    """The event topic and its dead-letter topic."""
    # An event just over the consumer's size limit must still be accepted by the
    # broker, so the consumer can put its original bytes (plus the reason) in the DLQ.
    limit = {"max.message.bytes": str(2 * settings.max_message_bytes + 64 * 1024)}
    return (
        TopicSpec(settings.topic, settings.topic_partitions, limit),
        TopicSpec(settings.dlq_topic, 1, limit),
    )


def ensure_settings_topics(settings: Settings) -> list[str]:
    """Create the event and dead-letter topics of ``settings`` if missing (idempotent,
    the broker does not); returns the names created. No broker is a
    ServiceUnavailable, another refusal a ServiceError."""
    return ensure_topics(settings.kafka_bootstrap, topic_specs(settings),
                         **kafka_client_options(settings))


def kafka_client_options(settings: Settings) -> dict[str, Any]:
    """kafka-python keyword arguments for the security settings (empty for PLAINTEXT)."""
    options: dict[str, Any] = {"security_protocol": settings.kafka_security_protocol}
    if settings.kafka_sasl_mechanism:
        options["sasl_mechanism"] = settings.kafka_sasl_mechanism
    if settings.kafka_sasl_username:
        options["sasl_plain_username"] = settings.kafka_sasl_username
    if settings.kafka_sasl_password is not None:
        options["sasl_plain_password"] = settings.kafka_sasl_password.get_secret_value()
    if settings.kafka_ssl_cafile is not None:
        options["ssl_cafile"] = str(settings.kafka_ssl_cafile)
    return options


def local_services(settings: Settings, *, kafka_version: str = KAFKA_VERSION) -> LocalServices:
    """Translate the settings into broker and Redis handles (nothing is started)."""
    kafka_host, kafka_port = _split_host_port(settings.kafka_bootstrap.split(",")[0].strip(), 9092)
    url = urlsplit(settings.redis_url)
    if url.scheme not in {"redis", "rediss"} or not url.hostname:
        raise ConfigError(f"RANKSTREAM_REDIS_URL must be redis://host:port/db, got {url.scheme}://")
    password = settings.redis_password.get_secret_value() if settings.redis_password else None
    password = password or url.password
    username = settings.redis_username or url.username
    users = (AclUser(username, password),) if username and password else ()
    state_dir = _absolute(settings.state_dir)
    cache_dir = _absolute(settings.cache_dir)
    if kafka_port >= 65535:
        raise ConfigError(f"the Kafka port must be below 65535 (its controller takes the "
                          f"next one), got {kafka_port}")
    return LocalServices(
        kafka=KafkaBroker(
            home=state_dir / "kafka",
            libs_dir=libs_dir_for(cache_dir, kafka_version),
            host=kafka_host,
            port=kafka_port,
            controller_port=kafka_port + 1,
            version=kafka_version,
        ),
        # Ours honours the configured credentials, so clients work either way.
        redis=RedisServer(home=state_dir / "redis", host=url.hostname, port=url.port or 6379,
                          requirepass=password, acl_users=users),
        topics=topic_specs(settings),
        kafka_options=kafka_client_options(settings),
        redis_username=username,
        redis_tls=url.scheme == "rediss",
        redis_ca_certs=str(settings.redis_ssl_ca_certs) if settings.redis_ssl_ca_certs else None,
        state_dir=state_dir,
        cache_dir=cache_dir,
    )


def _redis_ping(svc: LocalServices) -> PingState:
    """PING the configured address with the configured credentials and TLS."""
    return redis_ping(svc.redis.host, svc.redis.port, password=svc.redis.requirepass,
                      username=svc.redis_username, ssl=svc.redis_tls,
                      ssl_ca_certs=svc.redis_ca_certs)


def _redis_probe(svc: LocalServices) -> bool:
    return _redis_ping(svc) == "ready"


def _elsewhere(listens: str | None, configured: str) -> str | None:
    """Where ours listens (read back from the configuration it was started with), when
    that is not the configured address. ``localhost`` is ``127.0.0.1``, as our
    redis.conf has it: compared as text, a broker started on one and configured as the
    other was "elsewhere", `up` refused it and `down` left it running."""
    if listens is None or _loopback_named(listens) == _loopback_named(configured):
        return None
    return listens


def _loopback_named(address: str) -> str:
    host, colon, port = address.rpartition(":")
    return f"{'127.0.0.1' if host == 'localhost' else host}{colon}{port}"


def _not_here(pid: int | None, listens: str | None, configured: str
              ) -> tuple[int | None, str]:
    """For a status line: ``pid``, or None with a note when ours listens elsewhere
    (whatever answers at the configured address is then not it)."""
    elsewhere = _elsewhere(listens, configured) if pid is not None else None
    if elsewhere is None:
        return pid, ""
    return None, f"ours (pid {pid}) listens on {elsewhere}"


def _absolute(path: Path) -> Path:
    # The JVM and redis-server run in directories of their own, where a relative path
    # in their arguments and configs would point elsewhere; a shell elsewhere would
    # read one against its own directory.
    return path.expanduser().resolve()


def _redis_elsewhere(svc: LocalServices) -> str | None:
    return _elsewhere(listen_address(svc.redis), svc.redis.address)


def _moved_error(what: str, pid: int, elsewhere: str, configured: str, setting: str
                 ) -> ServiceError:
    return ServiceError(
        f"our {what} (pid {pid}) listens on {elsewhere}, not on the configured {configured}: "
        f"stop it (`{setting} ./run services down`) or use another RANKSTREAM_STATE_DIR")


# How long a listener on a service's port that does not answer yet gets (a container
# still starting, a Redis loading its data) before it counts as a stranger. Checked
# before anything is installed or fetched: those cannot help while the port is taken.
FOREIGN_WAIT_S = 30.0


def _wait_for_foreign_redis(svc: LocalServices, timeout: float, log: Log) -> bool:
    """True once something already on the Redis port answers as the configured Redis."""
    address = svc.redis.address
    log(f"{address} is taken but does not answer as Redis yet: waiting for it")
    state = wait_for_redis(lambda: _redis_ping(svc), timeout=min(timeout, FOREIGN_WAIT_S),
                           log=log)
    if state == "ready":
        return True
    if state == "loading":
        raise still_loading_error(svc.redis, None)
    if state == "denied":
        raise ServiceError(f"the Redis at {address} refuses the configured credentials "
                           "(RANKSTREAM_REDIS_URL, _REDIS_USERNAME, _REDIS_PASSWORD)")
    raise ServiceError(f"{address} is taken by a process that does not answer as Redis "
                       "(see `ss -ltnp`): stop it or set RANKSTREAM_REDIS_URL")


def _wait_for_foreign_kafka(broker: KafkaBroker, opts: Mapping[str, Any], timeout: float,
                            log: Log) -> bool:
    """True once something already on the Kafka port answers as a broker."""
    log(f"{broker.bootstrap} is taken but does not answer as Kafka yet: waiting for it")
    if _proc.wait_until(lambda: kafka_answers(broker.bootstrap, **opts),
                        min(timeout, FOREIGN_WAIT_S)):
        return True
    raise ServiceError(f"{broker.bootstrap} is taken by a process that does not answer as "
                       "Kafka (see `ss -ltnp`): stop it or set RANKSTREAM_KAFKA_BOOTSTRAP")


def _redis_up(svc: LocalServices, *, install: bool, timeout: float, log: Log) -> ServiceState:
    server = svc.redis
    address = f"{server.host}:{server.port}"
    pid = redis_pid(server)
    if pid is None and (_redis_probe(svc) or (
            _proc.port_open(server.host, server.port)
            and _wait_for_foreign_redis(svc, timeout, log))):
        durability = _appendonly(svc)
        if durability == "appendonly=no":
            # Debian's own service, say: the graph and offsets would survive a crash
            # only as of its last RDB snapshot. Ours always runs with the AOF.
            log(f"warning: the Redis at {address} runs without AOF (appendonly=no): a crash "
                "loses what it wrote since its last snapshot")
        return ServiceState("redis", address, True, "external", detail=f"reused {durability}")
    if pid is None:
        if not _proc.is_loopback(server.host) or svc.redis_tls:
            raise ServiceError(f"Redis at {address} does not answer, and we only start one on "
                               "loopback: start yours or fix RANKSTREAM_REDIS_URL")
        log(f"starting redis-server on {address}")
        pid = start_redis(server, binary=redis_binary(install=install), timeout=timeout,
                          log=log)
    else:
        _check_our_redis(svc, pid, timeout=timeout, log=log)
    return ServiceState("redis", address, True, "ours", pid, f"data {server.data_dir}")


def _check_our_redis(svc: LocalServices, pid: int, *, timeout: float, log: Log) -> None:
    """A live pid is not enough: it must answer, here, to the configured credentials."""
    server = svc.redis
    address = f"{server.host}:{server.port}"
    elsewhere = _redis_elsewhere(svc)
    if elsewhere is not None:
        # Starting a second one would share its data dir and pid file.
        raise _moved_error("redis-server", pid, elsewhere, address,
                           f"RANKSTREAM_REDIS_URL=redis://{elsewhere}/0")
    state = wait_for_redis(lambda: _redis_ping(svc), timeout=timeout, log=log)
    if state == "loading":
        raise still_loading_error(server, pid)
    if state == "denied":
        raise ServiceError(f"our redis-server (pid {pid}) at {address} refuses the configured "
                           "credentials (started with others?); `./run services down` and retry")
    if state != "ready":
        raise ServiceError(f"our redis-server (pid {pid}) runs but does not answer at "
                           f"{address}; `./run services down` and retry")


def _kafka_up(svc: LocalServices, *, install: bool, timeout: float, log: Log) -> ServiceState:
    broker = svc.kafka
    opts = svc.kafka_options
    pid = kafka_pid(broker)
    java: str | None = None  # once the jars are fetched and java found
    if pid is not None:
        elsewhere = _elsewhere(kafka_listen_address(broker), broker.bootstrap)
        if elsewhere is not None:
            # Waiting for it at the configured address could only time out.
            raise _moved_error("Kafka broker", pid, elsewhere, broker.bootstrap,
                               f"RANKSTREAM_KAFKA_BOOTSTRAP={elsewhere}")
        if str(broker.libs_dir) not in _proc.command_line(pid):
            # Started before a Kafka upgrade (or from another cache dir): serving the
            # old version as this one would hide the upgrade. Its data dir carries over.
            # The new jars and java first: offline, or with a mistyped cache dir, the
            # broker was stopped and then nothing could start.
            java = _jars_and_java(svc, install=install, log=log)
            log(f"restarting our Kafka broker (pid {pid}): it runs jars other than "
                f"{broker.libs_dir}")
            stop_kafka(broker)
            pid = None
    if pid is None and (kafka_answers(broker.bootstrap, **opts) or (
            _proc.port_open(broker.host, broker.port)
            and _wait_for_foreign_kafka(broker, opts, timeout, log))):
        return ServiceState("kafka", broker.bootstrap, True, "external", detail="reused")
    if pid is None:
        if not _proc.is_loopback(broker.host) or opts.get("security_protocol") != "PLAINTEXT":
            raise ServiceError(f"Kafka at {broker.bootstrap} does not answer, and we only start "
                               "a PLAINTEXT broker on loopback: start yours or fix the settings")
        java = java or _jars_and_java(svc, install=install, log=log)
        log(f"starting Kafka {broker.version} (KRaft) on {broker.bootstrap}")
        pid = start_kafka(broker, java=java, timeout=timeout)
    elif not _proc.wait_until(lambda: kafka_answers(broker.bootstrap, **opts), timeout):
        raise ServiceError(f"our Kafka broker (pid {pid}) runs but does not answer at "
                           f"{broker.bootstrap}")
    return ServiceState("kafka", broker.bootstrap, True, "ours", pid, f"Kafka {broker.version}")


def _jars_and_java(svc: LocalServices, *, install: bool, log: Log) -> str:
    """The broker's jars fetched (or their hashes checked) and the ``java`` to run."""
    fetch_kafka(svc.cache_dir, svc.kafka.version, install_tools=install, log=log)
    return java_binary(install=install)


def _create_topics(svc: LocalServices, *, timeout: float, log: Log) -> None:
    # Right after a cold start the controller may still be settling; retry briefly.
    deadline = time.monotonic() + timeout
    while True:
        try:
            created = ensure_topics(svc.kafka.bootstrap, svc.topics, **svc.kafka_options)
            break
        except ServiceUnavailable:  # a refusal (a colliding name) waited the whole timeout
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    for name in created:
        log(f"created topic {name}")


def up(settings: Settings, *, timeout: float = 120.0, install: bool = True,
       log: Log = _quiet) -> list[ServiceState]:
    """Make sure Redis and Kafka answer and the project topics exist. Idempotent.

    Starts what is missing (fetching Kafka's jars and installing redis-server the
    first time), reuses what already answers, waits up to ``timeout`` seconds per
    service (a Redis still loading its AOF gets longer, and is never killed for it),
    and raises :class:`ServiceError` (with the broker log's tail) if a
    service does not come up.
    """
    svc = local_services(settings)
    with _proc.file_lock(svc.lock_file):
        states = [
            _redis_up(svc, install=install, timeout=timeout, log=log),
            _kafka_up(svc, install=install, timeout=timeout, log=log),
        ]
        _create_topics(svc, timeout=timeout, log=log)
    return states


def down(settings: Settings, *, timeout: float = 60.0) -> list[str]:
    """Stop what we started (SIGTERM, then SIGKILL after ``timeout``); leave the rest."""
    svc = local_services(settings)
    with _proc.file_lock(svc.lock_file):
        return _stop_ours(svc, timeout=timeout)


def _stop_ours(svc: LocalServices, *, timeout: float) -> list[str]:
    kafka, redis = svc.kafka, svc.redis
    return [
        _down("kafka", kafka_pid(kafka), kafka_listen_address(kafka), kafka.bootstrap,
              lambda: stop_kafka(kafka, timeout=timeout)),
        _down("redis", redis_pid(redis), listen_address(redis), redis.address,
              lambda: stop_redis(redis, timeout=timeout)),
    ]


def _stopped(name: str, stopped: bool) -> str:
    return f"{name}: stopped" if stopped else f"{name}: not ours or not running"


def _down(name: str, pid: int | None, listens: str | None, configured: str,
          stop: Callable[[], bool]) -> str:
    elsewhere = _elsewhere(listens, configured) if pid is not None else None
    if elsewhere is not None:
        # Settings pointing at another port describe another server, not this one.
        return (f"{name}: ours (pid {pid}) listens on {elsewhere}, not on the configured "
                f"{configured}: left running")
    return _stopped(name, stop())


def status(settings: Settings) -> list[ServiceState]:
    """Look, do not touch: one state per service."""
    svc = local_services(settings)
    return [_redis_status(svc), _kafka_status(svc, settings)]


def _redis_status(svc: LocalServices) -> ServiceState:
    server = svc.redis
    address = f"{server.host}:{server.port}"
    pid, note = _not_here(redis_pid(server), listen_address(server), server.address)
    owner = "ours" if pid else "external"
    state = _redis_ping(svc)
    if state != "ready":
        detail = note or {"loading": "loading its data",
                          "denied": "refuses the configured credentials",
                          "silent": "process runs but does not answer (frozen?)" if pid else ""
                          }[state]
        return ServiceState("redis", address, False, owner if pid else "-", pid, detail)
    return ServiceState("redis", address, True, owner, pid, f"{_appendonly(svc)} {note}".strip())


def _appendonly(svc: LocalServices) -> str:
    import redis as redis_py

    client = redis_py.Redis(host=svc.redis.host, port=svc.redis.port,
                            password=svc.redis.requirepass, username=svc.redis_username,
                            ssl=svc.redis_tls, ssl_ca_certs=svc.redis_ca_certs,
                            socket_timeout=1.0, decode_responses=True)
    try:
        return f"appendonly={client.config_get('appendonly').get('appendonly', '?')}"
    except redis_py.RedisError:
        return "appendonly=? (CONFIG not allowed)"
    finally:
        client.close()


def _kafka_status(svc: LocalServices, settings: Settings) -> ServiceState:
    broker = svc.kafka
    pid = kafka_pid(broker)
    pid, note = _not_here(pid, kafka_listen_address(broker), broker.bootstrap)
    owner = "ours" if pid else "external"
    if not kafka_answers(broker.bootstrap, **svc.kafka_options):
        return ServiceState("kafka", broker.bootstrap, False, owner if pid else "-", pid,
                            note or ("process runs but does not answer" if pid else ""))
    names = [spec.name for spec in svc.topics]
    found = topic_partitions(broker.bootstrap, names, **svc.kafka_options)
    topics = " ".join(f"{n}({found[n]})" if n in found else f"{n}(missing)" for n in names)
    version = f"Kafka {broker.version} " if pid else ""
    return ServiceState("kafka", broker.bootstrap, True, owner, pid,
                        f"{version}topics {topics} {note}".strip())


def env_lines(settings: Settings) -> list[str]:
    """``export RANKSTREAM_...=...`` lines for a shell (``eval "$(... env)"``); no secrets."""
    values = {
        "KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "TOPIC": settings.topic,
        "DLQ_TOPIC": settings.dlq_topic,
        "TOPIC_PARTITIONS": str(settings.topic_partitions),
        "REDIS_URL": settings.redis_url,
        "KEY_PREFIX": settings.key_prefix,
        "CACHE_DIR": str(_absolute(settings.cache_dir)),
        "STATE_DIR": str(_absolute(settings.state_dir)),
        "GROUP_ID": settings.group_id,
        # "" turns snapshots off; unset, they would silently come back on.
        "SNAPSHOT_DIR": "" if settings.snapshot_dir is None else str(_absolute(
            settings.snapshot_dir)),
        # Without these a shell that evals the output talked PLAINTEXT to a SASL broker.
        "KAFKA_SECURITY_PROTOCOL": settings.kafka_security_protocol,
    }
    optional = {
        "REDIS_USERNAME": settings.redis_username,
        "REDIS_SSL_CA_CERTS": settings.redis_ssl_ca_certs,
        "KAFKA_SASL_MECHANISM": settings.kafka_sasl_mechanism,
        "KAFKA_SASL_USERNAME": settings.kafka_sasl_username,
        "KAFKA_SSL_CAFILE": settings.kafka_ssl_cafile,
    }
    values.update({key: str(value) for key, value in optional.items() if value})
    lines = [f"export RANKSTREAM_{key}={shlex.quote(value)}" for key, value in values.items()]
    # A secret is never printed; credentials given in the URL live in the password
    # setting, so without these lines the exported settings silently lost them.
    for name, secret in (("REDIS_PASSWORD", settings.redis_password),
                         ("KAFKA_SASL_PASSWORD", settings.kafka_sasl_password)):
        if secret is not None:
            lines.append(f"# the {name.split('_')[0].title()} password is not exported: "
                         f"set RANKSTREAM_{name}")
    return lines
