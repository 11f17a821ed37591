"""The consumer against a password-protected Redis with ACL users limited to one prefix.

A second redis-server (``rankstream.services.auth_redis``) runs with ``requirepass``
and two ACL users that may only touch keys under their own prefix:

* ``ranker`` may run the commands the consumer needs, scripting included (the
  default bulk writes are ``EVAL`` scripts; Redis checks the key pattern on every
  ``redis.call`` inside them);
* ``plain`` has no scripting at all: the consumer runs with ``--plain-writes``;
* ``rekeyer`` is ``ranker`` over two prefixes: ``rankstream rekey`` copies from one to
  the other with nothing @dangerous (it used DUMP/RESTORE, a review found).

Both must consume a log correctly, neither may reach a key outside its prefix, and
the password (given as a setting, a SecretStr, or inside the Redis URL) must never
appear in the consumer's output, even at DEBUG level.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis as redis_py
from pydantic import SecretStr

from consumer.keys import Keys
from rankstream.services import AclUser, auth_redis, env_lines, start_redis, stop_redis
from rankstream.services.testing import Isolated
from rankstream.settings import Settings
from tests.faults.harness import audit, replay
from tests.faults.known_log import build_log
from tests.faults.stack import free_port, settings_env

PASSWORD = "s3cret-" + uuid.uuid4().hex  # unique: grep-able in any output
USER_PASSWORD = "acl-" + uuid.uuid4().hex
PREFIX = f"authz:{uuid.uuid4().hex[:8]}:"
PLAIN_PREFIX = f"authz-plain:{uuid.uuid4().hex[:8]}:"
# Under PREFIX (the server holds keys under the two prefixes above only), side by side.
REKEY_FROM, REKEY_TO = f"{PREFIX}from:", f"{PREFIX}to:"
# What a consumer needs: data commands, transactions, connection setup (HELLO,
# CLIENT SETNAME), key expiry and deletion for the lease; nothing @dangerous.
BASE_RULES = "resetchannels -@all +@read +@write +@transaction +@connection +@keyspace " \
             "-@dangerous"


@dataclass(frozen=True)
class AuthRedis:
    url: str
    host: str
    port: int


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthRedis]:
    users = (AclUser("ranker", USER_PASSWORD, f"resetkeys ~{PREFIX}* {BASE_RULES} +@scripting"),
             AclUser("plain", USER_PASSWORD, f"resetkeys ~{PLAIN_PREFIX}* {BASE_RULES} "
                                             "-@scripting"),
             AclUser("rekeyer", USER_PASSWORD, f"resetkeys ~{REKEY_FROM}* ~{REKEY_TO}* "
                                               f"{BASE_RULES} +@scripting"))
    server = auth_redis(tmp_path_factory.mktemp("auth-redis"), free_port(), PASSWORD, users)
    start_redis(server)
    try:
        yield AuthRedis(server.url, server.host, server.port)
    finally:
        stop_redis(server)


def run_consumer(settings: Settings, *args: str, env: dict[str, str] | None = None
                 ) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")}
    full.update(settings_env(settings))
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "consumer", "consume", "--until-caught-up",
                           "--log-level", "DEBUG", *args], env=full, capture_output=True,
                          text=True, timeout=240, check=False)


def admin(secured: AuthRedis) -> redis_py.Redis:
    return redis_py.Redis(host=secured.host, port=secured.port, password=PASSWORD)


@pytest.mark.parametrize(("user", "prefix", "flags"), [
    ("ranker", PREFIX, ()),
    ("plain", PLAIN_PREFIX, ("--plain-writes",)),
])
def test_acl_user_limited_to_the_prefix_consumes_a_log(
        secured: AuthRedis, isolated: Isolated, user: str, prefix: str,
        flags: tuple[str, ...]) -> None:
    settings = isolated.settings.model_copy(update={
        "redis_url": secured.url, "redis_username": user,
        "redis_password": SecretStr(USER_PASSWORD), "key_prefix": prefix,
        "batch_max_events": 100})
    log = build_log(600, seed=3)
    replay(settings, log)
    done = run_consumer(settings, *flags)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert USER_PASSWORD not in output and PASSWORD not in output
    assert "refusing" not in output and "NOPERM" not in output
    client = admin(secured)
    try:
        result = audit(client, settings, log)
        result.check()
        # This server only ever holds keys under the two users' prefixes.
        assert all(key.startswith((PREFIX.encode(), PLAIN_PREFIX.encode()))
                   for key in client.scan_iter(count=1000))
        assert client.exists(Keys(prefix).lock) == 0  # released on the clean exit
    finally:
        client.close()
    own = redis_py.Redis(host=secured.host, port=secured.port, username=user,
                         password=USER_PASSWORD)
    try:
        assert own.hget(Keys(prefix).graph, "version") is not None
        with pytest.raises(redis_py.exceptions.NoPermissionError):
            own.set("outside:the:prefix", "1")
        with pytest.raises(redis_py.exceptions.NoPermissionError):
            own.flushall()
        if user == "plain":
            with pytest.raises(redis_py.exceptions.NoPermissionError):
                own.eval("return 1", 0)
    finally:
        own.close()


def test_rekey_runs_as_a_user_without_dangerous_commands(secured: AuthRedis) -> None:
    from consumer.rekey import rekey
    from tests.integration.conftest import HandGraph

    client = admin(secured)
    own = redis_py.Redis(host=secured.host, port=secured.port, username="rekeyer",
                         password=USER_PASSWORD)
    try:
        HandGraph(client, REKEY_FROM).write(
            [("https://a.example/", "https://b.example/")], titles={"https://b.example/": "b"},
            pagerank={"https://a.example/": 0.15, "https://b.example/": 0.28})
        client.hset(f"{REKEY_FROM}meta:pagerank", mapping={"total": 0.43, "bound": 1e-9})
        report = rekey(own, REKEY_FROM, REKEY_TO, "t")
        assert (report.ids_after, report.links) == (2, 1)
        assert client.zrange(f"{REKEY_TO}scores:pagerank", 0, -1) == [
            b"https://a.example/", b"https://b.example/"]
        assert client.hget(f"{REKEY_TO}graph", "rekey_unfinished") is None
    finally:
        for prefix in (REKEY_FROM, REKEY_TO):
            for key in client.scan_iter(match=f"{prefix}*", count=1000):
                client.delete(key)
        own.close()
        client.close()


def test_password_in_the_url_is_never_logged(secured: AuthRedis, isolated: Isolated) -> None:
    settings = isolated.settings.model_copy(update={
        "redis_url": f"redis://ranker:{USER_PASSWORD}@{secured.host}:{secured.port}/0",
        "key_prefix": PREFIX + "url:"})
    replay(settings, build_log(50, seed=4, odd_urls=False))
    done = run_consumer(settings)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert USER_PASSWORD not in done.stdout + done.stderr
    assert f"{secured.host}:{secured.port}" in done.stderr  # the address is logged


def test_wrong_password_fails_fast_without_showing_it(secured: AuthRedis,
                                                      isolated: Isolated) -> None:
    settings = isolated.settings.model_copy(update={
        "redis_url": secured.url, "redis_username": "ranker",
        "redis_password": SecretStr(PASSWORD), "key_prefix": PREFIX + "wrong:"})
    started = time.monotonic()
    done = run_consumer(settings)
    assert done.returncode == 2
    assert time.monotonic() - started < 30  # not retried as if Redis were down
    assert "refused our credentials" in done.stderr.strip().splitlines()[-1]
    assert PASSWORD not in done.stdout + done.stderr


def test_secrets_stay_out_of_reprs_errors_and_env_lines(secured: AuthRedis,
                                                        services: Settings) -> None:
    from consumer.redis_store import connect_redis

    settings = services.model_copy(update={
        "redis_url": secured.url, "redis_username": "ranker",
        "redis_password": SecretStr(USER_PASSWORD),
        "kafka_sasl_password": SecretStr(PASSWORD)})
    assert USER_PASSWORD not in repr(settings) and PASSWORD not in str(settings)
    assert not any(USER_PASSWORD in line or PASSWORD in line for line in env_lines(settings))
    wrong = settings.model_copy(update={"redis_password": SecretStr(PASSWORD)})
    client = connect_redis(wrong)
    try:
        with pytest.raises(redis_py.AuthenticationError) as caught:
            client.ping()
        assert PASSWORD not in str(caught.value)
    finally:
        client.close()


def test_auth_redis_requires_the_password(secured: AuthRedis) -> None:
    anonymous = redis_py.Redis(host=secured.host, port=secured.port)
    try:
        # NOAUTH: redis-py raises AuthenticationError (older versions ResponseError).
        with pytest.raises((redis_py.AuthenticationError, redis_py.ResponseError)):
            anonymous.ping()
    finally:
        anonymous.close()
