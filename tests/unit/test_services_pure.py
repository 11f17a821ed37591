"""The service scripts' pure helpers (no broker or redis-server needed)."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest

from rankstream.errors import ConfigError, ServiceError
from rankstream.services import kafka, kafka_jars, redis, stack
from rankstream.settings import load_settings


def test_cluster_ids_never_start_with_a_dash():
    # The storage tool's argument parser took "-t -Xy..." for an option (seen in CI).
    dashed = uuid.UUID(bytes=base64.urlsafe_b64decode("-" + "A" * 21 + "=="))
    plain = uuid.UUID(int=7)
    with mock.patch.object(kafka.uuid, "uuid4", side_effect=[dashed, plain]):
        cluster_id = kafka.new_cluster_id()
    assert cluster_id == base64.urlsafe_b64encode(plain.bytes).rstrip(b"=").decode()
    for _ in range(2000):
        cluster_id = kafka.new_cluster_id()
        assert len(cluster_id) == 22 and not cluster_id.startswith("-")


# --- redis.conf -------------------------------------------------------------------

def test_redis_conf_quotes_paths_with_spaces(tmp_path: Path) -> None:
    # A HOME with a space in it made redis-server refuse its own config.
    server = redis.RedisServer(home=tmp_path / "my home" / "redis", port=16399)
    conf = redis.redis_conf(server).splitlines()
    assert f'pidfile "{server.pid_file}"' in conf
    assert f'logfile "{server.log_file}"' in conf
    assert f'dir "{server.data_dir}"' in conf


@pytest.mark.parametrize("bad", ['say "hi"', "back\\slash", "new\nline"])
def test_redis_conf_refuses_paths_it_cannot_quote(tmp_path: Path, bad: str) -> None:
    server = redis.RedisServer(home=tmp_path / bad)
    with pytest.raises(ServiceError, match="RANKSTREAM_STATE_DIR"):
        redis.redis_conf(server)


def test_listen_address_is_read_back_from_the_config_we_wrote(tmp_path: Path) -> None:
    server = redis.RedisServer(home=tmp_path, host="localhost", port=16399,
                               requirepass="pw", acl_users=(redis.AclUser("u", "p"),))
    assert redis.listen_address(server) is None
    server.conf_file.write_text(redis.redis_conf(server))
    assert redis.listen_address(server) == server.address == "127.0.0.1:16399"
    moved = redis.RedisServer(home=tmp_path, port=16400)
    assert redis.listen_address(moved) != moved.address


# --- Debian's service -------------------------------------------------------------

def test_debian_redis_service_is_stopped_and_disabled_best_effort() -> None:
    calls: list[list[str]] = []

    def run_checked(argv: list[str], **_: object) -> str:
        calls.append(argv)
        raise ServiceError(f"{argv[0]} not found")  # no init tools in a container

    with mock.patch.object(redis._proc, "live_pid", return_value=321), \
            mock.patch.object(redis._proc, "run_checked", side_effect=run_checked):
        redis._stop_debian_service()
    assert calls == [["invoke-rc.d", "redis-server", "stop"],
                     ["update-rc.d", "redis-server", "disable"],
                     ["systemctl", "disable", "redis-server"]]


def test_debian_redis_service_is_disabled_even_when_not_running() -> None:
    with mock.patch.object(redis._proc, "live_pid", return_value=None), \
            mock.patch.object(redis._proc, "run_checked", return_value="") as run:
        redis._stop_debian_service()
    assert [c.args[0][0] for c in run.call_args_list] == ["update-rc.d", "systemctl"]


# --- waiting for a redis-server -------------------------------------------------------

@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis.time, "sleep", lambda _: None)


def _probe(*states: redis.PingState) -> Callable[[], redis.PingState]:
    answers = iter(states)
    return lambda: next(answers)


def test_wait_keeps_waiting_for_a_server_loading_its_aof(no_sleep: None) -> None:
    said: list[str] = []
    # timeout=0 would give up after the first "silent"; LOADING extends the wait.
    state = redis.wait_for_redis(_probe("loading", "loading", "silent", "ready"),
                                 timeout=0.0, log=said.append)
    assert state == "ready"
    assert len(said) == 1 and "loading" in said[0]


def test_wait_gives_up_on_a_silent_server_after_the_timeout(no_sleep: None) -> None:
    assert redis.wait_for_redis(_probe("silent"), timeout=0.0) == "silent"


def test_wait_reports_loading_when_loading_outlasts_its_timeout(
    no_sleep: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis, "LOADING_TIMEOUT", 0.0)
    # A probe timing out mid-load is still a server that is loading.
    assert redis.wait_for_redis(_probe("loading", "silent"), timeout=0.0) == "loading"


def _start_patched(tmp_path: Path, state: redis.PingState) -> tuple[mock.MagicMock, str]:
    server = redis.RedisServer(home=tmp_path, port=16399)
    with mock.patch.object(redis, "redis_pid", side_effect=[None, 4242, 4242]), \
            mock.patch.object(redis._proc, "port_open", return_value=False), \
            mock.patch.object(redis._proc, "run_checked", return_value=""), \
            mock.patch.object(redis, "_ping_server", return_value=state), \
            mock.patch.object(redis._proc, "stop_process") as stop, \
            pytest.raises(ServiceError) as failed:
        redis.start_redis(server, binary="redis-server", timeout=0.0)
    return stop, str(failed.value)


def test_start_never_kills_a_server_still_loading_its_data(
    tmp_path: Path, no_sleep: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis, "LOADING_TIMEOUT", 0.0)
    stop, message = _start_patched(tmp_path, "loading")
    stop.assert_not_called()
    assert "still loading its data" in message and "pid 4242" in message


def test_start_stops_a_server_that_never_answers(tmp_path: Path, no_sleep: None) -> None:
    stop, message = _start_patched(tmp_path, "silent")
    stop.assert_called_once()
    assert "did not answer" in message


# --- up / down with a redis-server of ours --------------------------------------------

def _ours(tmp_path: Path, *, started_on: int, configured: int) -> stack.LocalServices:
    """Services configured for port ``configured``; ours was started on ``started_on``."""
    settings = load_settings(redis_url=f"redis://127.0.0.1:{configured}/0",
                             state_dir=tmp_path, cache_dir=tmp_path,
                             redis_password=None, redis_username=None)
    svc = stack.local_services(settings)
    svc.redis.home.mkdir(parents=True)
    started = redis.RedisServer(home=svc.redis.home, port=started_on)
    svc.redis.conf_file.write_text(redis.redis_conf(started))
    return svc


def test_up_refuses_our_redis_listening_on_another_port(tmp_path: Path) -> None:
    svc = _ours(tmp_path, started_on=16399, configured=16380)
    with mock.patch.object(stack, "redis_pid", return_value=4242), \
            mock.patch.object(stack, "redis_ping") as ping, \
            pytest.raises(ServiceError, match=r"pid 4242\) listens on 127.0.0.1:16399, not on "
                                              r"the configured 127.0.0.1:16380"):
        stack._redis_up(svc, install=False, timeout=0.0, log=print)
    ping.assert_not_called()


@pytest.mark.parametrize(("state", "why"), [("silent", "does not answer at 127.0.0.1:16399"),
                                            ("denied", "refuses the configured credentials")])
def test_up_refuses_our_redis_when_it_does_not_answer(
    tmp_path: Path, no_sleep: None, state: redis.PingState, why: str
) -> None:
    # A live pid used to be enough: a frozen server counted as up.
    svc = _ours(tmp_path, started_on=16399, configured=16399)
    with mock.patch.object(stack, "redis_pid", return_value=4242), \
            mock.patch.object(stack, "redis_ping", return_value=state), \
            pytest.raises(ServiceError, match=why):
        stack._redis_up(svc, install=False, timeout=0.0, log=print)


def test_up_accepts_our_redis_once_it_answers(tmp_path: Path, no_sleep: None) -> None:
    svc = _ours(tmp_path, started_on=16399, configured=16399)
    with mock.patch.object(stack, "redis_pid", return_value=4242), \
            mock.patch.object(stack, "redis_ping", side_effect=["loading", "ready"]):
        state = stack._redis_up(svc, install=False, timeout=0.0, log=lambda _: None)
    assert (state.up, state.owner, state.pid) == (True, "ours", 4242)


def test_down_leaves_our_redis_on_another_port_alone(tmp_path: Path) -> None:
    svc = _ours(tmp_path, started_on=16399, configured=16380)
    with mock.patch.object(stack, "redis_pid", return_value=4242), \
            mock.patch.object(stack, "stop_kafka", return_value=False), \
            mock.patch.object(stack, "stop_redis") as stop:
        _, said = stack._stop_ours(svc, timeout=1.0)
    stop.assert_not_called()
    assert said.endswith("listens on 127.0.0.1:16399, not on the configured 127.0.0.1:16380: "
                         "left running")


# --- fetching Kafka -----------------------------------------------------------------

def test_kafka_jars_are_fetched_with_strict_checksums(tmp_path: Path) -> None:
    # Maven 3.8 only warns on a checksum mismatch, and the corrupt jar stays cached.
    argv = kafka_jars.mvn_fetch_command("mvn", tmp_path)
    assert argv[0] == "mvn" and ("-C" in argv or "--strict-checksums" in argv)
    assert f"-Dmaven.repo.local={tmp_path / 'm2'}" in argv


# --- up / down with a Kafka broker of ours ---------------------------------------------

def _our_broker(tmp_path: Path, *, started_on: int, configured: int) -> stack.LocalServices:
    """Services configured for port ``configured``; our broker was started on ``started_on``."""
    settings = load_settings(kafka_bootstrap=f"127.0.0.1:{configured}", state_dir=tmp_path,
                             cache_dir=tmp_path)
    svc = stack.local_services(settings)
    svc.kafka.home.mkdir(parents=True)
    started = kafka.KafkaBroker(home=svc.kafka.home, libs_dir=svc.kafka.libs_dir,
                                port=started_on)
    svc.kafka.properties_file.write_text(kafka.server_properties(started))
    return svc


def test_cached_kafka_jars_are_checked_against_the_hashes_taken_at_fetch(
    tmp_path: Path,
) -> None:
    """The cache used to list jar names only: a truncated or replaced jar, or one
    dropped into libs/ (the classpath is libs/*), was used for good."""
    libs = tmp_path / "libs"
    libs.mkdir()
    assert kafka_jars.jars_problem(libs) == "not fetched yet"
    for name in ("a.jar", "b.jar"):
        (libs / name).write_bytes(name.encode() * 1000)
    (libs / ".complete").write_text("a.jar\nb.jar\n")  # what older versions wrote
    assert kafka_jars.jars_problem(libs) == "cached before jar hashes were recorded"
    (libs / ".complete").write_text("".join(
        f"{kafka_jars._sha256(libs / n)}  {n}\n" for n in ("a.jar", "b.jar")))
    assert kafka_jars.jars_problem(libs) is None
    (libs / "extra.jar").write_bytes(b"x")
    assert kafka_jars.jars_problem(libs) == "1 jar(s) added or missing since the fetch: extra.jar"
    (libs / "extra.jar").unlink()
    (libs / "b.jar").write_bytes(b"truncated")
    assert kafka_jars.jars_problem(libs) == "1 jar(s) changed since the fetch: b.jar"


def _fake_maven(jar: bytes) -> Callable[..., None]:
    """``mvn`` copying a Kafka 9.9.9 whose one jar holds ``jar``."""

    def maven(argv: list[str], **_: object) -> None:
        out = Path(next(a for a in argv if a.startswith("-DoutputDirectory="))
                   .partition("=")[2])
        out.mkdir()
        (out / "kafka_2.13-9.9.9.jar").write_bytes(jar)

    return maven


def test_a_bad_jar_cache_is_fetched_again_and_says_why(tmp_path: Path) -> None:
    libs = kafka_jars.libs_dir_for(tmp_path, "9.9.9")
    libs.mkdir(parents=True)
    (libs / "kafka_2.13-9.9.9.jar").write_bytes(b"old")
    (libs / ".complete").write_text("kafka_2.13-9.9.9.jar\n")

    said: list[str] = []
    with mock.patch.object(kafka._proc, "require_binary", return_value="mvn"), \
            mock.patch.object(kafka._proc, "run_checked", side_effect=_fake_maven(b"new")):
        assert kafka_jars.fetch_kafka(tmp_path, "9.9.9", log=said.append) == libs
        assert kafka_jars.fetch_kafka(tmp_path, "9.9.9", log=said.append) == libs  # cached now
    assert said == [f"fetching Kafka 9.9.9 from Maven Central into {libs} "
                    "(cached before jar hashes were recorded)"]
    assert (libs / "kafka_2.13-9.9.9.jar").read_bytes() == b"new"
    assert kafka_jars.jars_problem(libs) is None


def test_kafka_listen_address_is_read_back_from_the_config_we_wrote(tmp_path: Path) -> None:
    svc = _our_broker(tmp_path, started_on=19092, configured=19092)
    assert kafka.kafka_listen_address(svc.kafka) == svc.kafka.bootstrap == "127.0.0.1:19092"
    svc.kafka.properties_file.unlink()
    assert kafka.kafka_listen_address(svc.kafka) is None


def test_up_and_down_leave_our_broker_on_another_port_alone(tmp_path: Path) -> None:
    """Waiting for it at the configured address could only time out, with a
    misleading 'does not answer'; down with such settings used to stop it."""
    svc = _our_broker(tmp_path, started_on=19092, configured=19094)
    with mock.patch.object(stack, "kafka_pid", return_value=4243), \
            mock.patch.object(stack, "kafka_answers", return_value=False) as answers, \
            pytest.raises(ServiceError, match=r"pid 4243\) listens on 127.0.0.1:19092, not on "
                                              r"the configured 127.0.0.1:19094"):
        stack._kafka_up(svc, install=False, timeout=0.0, log=print)
    answers.assert_not_called()
    with mock.patch.object(stack, "kafka_pid", return_value=4243), \
            mock.patch.object(stack, "stop_redis", return_value=False), \
            mock.patch.object(stack, "stop_kafka") as stop:
        said, _ = stack._stop_ours(svc, timeout=0.0)
    stop.assert_not_called()
    assert "left running" in said


# --- whose process is it -------------------------------------------------------------

def test_a_stale_pid_file_naming_a_stranger_is_not_ours(tmp_path: Path) -> None:
    """After a reboot the kernel may give the number to an unrelated process, which
    `down` would then stop: Redis's must also run in its data dir."""
    import os

    from rankstream.services import _proc

    pid_file = tmp_path / "x.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    assert _proc.live_pid(pid_file, "python") == os.getpid()
    assert _proc.live_pid(pid_file, "python", cwd=Path.cwd()) == os.getpid()
    assert _proc.live_pid(pid_file, "python", cwd=tmp_path) is None
    assert _proc.live_pid(pid_file, "redis-server") is None


@pytest.mark.parametrize(
    ("banner", "major"),
    [('openjdk version "17.0.15" 2025-04-15', 17), ('openjdk version "21" 2023-09-19', 21),
     ('openjdk version "11.0.2" 2019-01-15', 11), ('java version "1.8.0_292"', 8)],
)
def test_java_older_than_17_is_refused_in_one_line(banner: str, major: int) -> None:
    with mock.patch.object(kafka._proc, "require_binary", return_value="/usr/bin/java"), \
            mock.patch.object(kafka._proc, "run_checked", return_value=banner + "\n"):
        if major >= kafka_jars.MIN_JAVA:
            assert kafka_jars.java_binary(install=False) == "/usr/bin/java"
        else:
            with pytest.raises(ServiceError, match=f"needs Java 17 or newer, and "
                                                   f"/usr/bin/java is Java {major}: install"):
                kafka_jars.java_binary(install=False)


def test_our_broker_running_other_jars_is_restarted_on_these(tmp_path: Path) -> None:
    svc = _our_broker(tmp_path, started_on=19092, configured=19092)
    old_jars = "java -cp /old/cache/kafka-4.0.0/libs/* kafka.Kafka server.properties"
    with mock.patch.object(stack, "kafka_pid", return_value=4243), \
            mock.patch.object(stack._proc, "command_line", return_value=old_jars), \
            mock.patch.object(stack, "stop_kafka") as stop, \
            mock.patch.object(stack, "kafka_answers", return_value=False), \
            mock.patch.object(stack._proc, "port_open", return_value=False), \
            mock.patch.object(stack, "fetch_kafka") as fetch, \
            mock.patch.object(stack, "java_binary", return_value="java"), \
            mock.patch.object(stack, "start_kafka", return_value=4300) as start:
        state = stack._kafka_up(svc, install=False, timeout=0.0, log=print)
    stop.assert_called_once_with(svc.kafka)
    fetch.assert_called_once()  # before the stop, and not again before the start
    start.assert_called_once()
    assert (state.pid, state.owner) == (4300, "ours")


def test_a_restart_onto_jars_that_cannot_be_fetched_leaves_the_broker_running(
        tmp_path: Path) -> None:
    """It was stopped first: offline, or with a mistyped cache dir, `up` left Kafka down."""
    svc = _our_broker(tmp_path, started_on=19092, configured=19092)
    old_jars = "java -cp /old/cache/kafka-4.0.0/libs/* kafka.Kafka server.properties"
    with mock.patch.object(stack, "kafka_pid", return_value=4243), \
            mock.patch.object(stack._proc, "command_line", return_value=old_jars), \
            mock.patch.object(stack, "stop_kafka") as stop, \
            mock.patch.object(stack, "fetch_kafka",
                              side_effect=ServiceError("mvn not found")), \
            pytest.raises(ServiceError, match="mvn not found"):
        stack._kafka_up(svc, install=False, timeout=0.0, log=print)
    stop.assert_not_called()


def test_localhost_and_127_0_0_1_are_one_address() -> None:
    """Compared as text, `down` left a broker started on one, configured as the other."""
    assert stack._elsewhere("127.0.0.1:19092", "localhost:19092") is None
    assert stack._elsewhere("localhost:19092", "127.0.0.1:19092") is None
    assert stack._elsewhere("127.0.0.1:19093", "localhost:19092") == "127.0.0.1:19093"
    assert stack._elsewhere(None, "localhost:19092") is None


def test_a_file_system_failure_is_a_one_line_error_naming_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rankstream.services.__main__ import main

    (tmp_path / "a-file").write_text("")
    with mock.patch.dict("os.environ", {"RANKSTREAM_STATE_DIR": str(tmp_path / "a-file" / "s")}):
        assert main(["down"]) == 2
    err = capsys.readouterr().err
    assert err == f"rankstream services down: error: Not a directory: {tmp_path}/a-file/s\n"


@pytest.mark.parametrize("service", ["redis", "kafka"])
def test_a_stranger_on_the_port_is_named_before_anything_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, service: str
) -> None:
    """A foreign listener (or a container still starting) used to cost an apt install
    and a Maven download before the port check said it was taken."""
    import socket

    stranger = socket.socket()
    stranger.bind(("127.0.0.1", 0))
    stranger.listen()
    port = stranger.getsockname()[1]
    monkeypatch.setattr(stack, "FOREIGN_WAIT_S", 0.3)
    settings = load_settings(redis_url=f"redis://127.0.0.1:{port}/0",
                             kafka_bootstrap=f"127.0.0.1:{port}", state_dir=tmp_path,
                             cache_dir=tmp_path)
    svc = stack.local_services(settings)
    refuse = mock.Mock(side_effect=AssertionError("installed or fetched"))
    try:
        with mock.patch.object(stack, "redis_binary", refuse), \
                mock.patch.object(stack, "fetch_kafka", refuse), \
                mock.patch.object(stack, "java_binary", refuse), \
                mock.patch.object(stack, "kafka_answers", return_value=False), \
                pytest.raises(ServiceError, match=f"127.0.0.1:{port} is taken by a process "
                                                  f"that does not answer as "):
            up = stack._redis_up if service == "redis" else stack._kafka_up
            up(svc, install=True, timeout=5.0, log=lambda _line: None)
    finally:
        stranger.close()


def test_credentials_in_the_redis_url_move_into_their_own_settings_and_are_never_shown():
    settings = load_settings(redis_url="redis://ranker:s3cr%2Fet@127.0.0.1:6379/2")
    assert settings.redis_url == "redis://127.0.0.1:6379/2"
    assert settings.redis_username == "ranker"
    assert settings.redis_password is not None
    assert settings.redis_password.get_secret_value() == "s3cr/et"
    assert "s3cr" not in repr(settings) and "s3cr" not in "\n".join(stack.env_lines(settings))
    # A password alone: the username setting stays as it was.
    only = load_settings(redis_url="rediss://:pw@host:6380/0", redis_username="me")
    assert (only.redis_url, only.redis_username) == ("rediss://host:6380/0", "me")
    assert only.redis_password is not None and only.redis_password.get_secret_value() == "pw"


def test_odd_redis_urls_keep_their_credentials_out_and_their_address_whole():
    unix = load_settings(redis_url="unix://:pw@/tmp/redis.sock")
    assert unix.redis_url == "unix:///tmp/redis.sock"
    assert unix.redis_password is not None and unix.redis_password.get_secret_value() == "pw"
    # An empty password in the URL is ignored, as redis-py ignores it.
    kept = load_settings(redis_url="redis://u:@h:6379/0", redis_password="x")
    assert kept.redis_password is not None and kept.redis_password.get_secret_value() == "x"
    ipv6 = load_settings(redis_url="redis://a:b%40c@[::1]:6379/2")
    assert (ipv6.redis_url, ipv6.redis_username) == ("redis://[::1]:6379/2", "a")
    lines = stack.env_lines(ipv6)
    assert "export RANKSTREAM_REDIS_USERNAME=a" in lines
    assert lines[-1] == "# the Redis password is not exported: set RANKSTREAM_REDIS_PASSWORD"
    assert not any("b@c" in line for line in lines)


def test_relative_state_and_cache_dirs_become_absolute_and_the_last_port_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JVM and redis-server run in directories of their own: a relative path in
    their arguments pointed inside them, and formatting the storage failed."""
    monkeypatch.chdir(tmp_path)
    svc = stack.local_services(load_settings(state_dir=Path(".state"),
                                             cache_dir=Path(".cache")))
    assert svc.kafka.home == tmp_path / ".state" / "kafka"
    assert svc.kafka.libs_dir.is_absolute() and svc.redis.home.is_absolute()
    with pytest.raises(ConfigError, match="below 65535"):
        stack.local_services(load_settings(kafka_bootstrap="127.0.0.1:65535"))


def test_two_runs_sharing_the_jar_cache_fetch_once(tmp_path: Path) -> None:
    """Each deleted the other's scratch directory, and both runs failed."""
    import threading
    import time

    fetches: list[int] = []
    fake = _fake_maven(b"jar")

    def maven(argv: list[str], **_: object) -> None:
        fetches.append(1)
        time.sleep(0.3)
        fake(argv)

    results: list[Path] = []
    with mock.patch.object(kafka._proc, "require_binary", return_value="mvn"), \
            mock.patch.object(kafka._proc, "run_checked", side_effect=maven):
        runs = [threading.Thread(target=lambda: results.append(
            kafka_jars.fetch_kafka(tmp_path, "9.9.9"))) for _ in range(2)]
        for run in runs:
            run.start()
        for run in runs:
            run.join()
    assert len(fetches) == 1 and len(results) == 2
    assert kafka_jars.jars_problem(kafka_jars.libs_dir_for(tmp_path, "9.9.9")) is None


def test_services_env_exports_the_security_and_snapshot_settings_never_secrets() -> None:
    from pydantic import SecretStr

    settings = load_settings(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="PLAIN",
                             kafka_sasl_username="crawler",
                             kafka_sasl_password=SecretStr("k-s3cret"), snapshot_dir="",
                             group_id="g1")
    lines = stack.env_lines(settings)
    text = "\n".join(lines)
    for exported in ("RANKSTREAM_KAFKA_SECURITY_PROTOCOL=SASL_SSL",
                     "RANKSTREAM_KAFKA_SASL_MECHANISM=PLAIN",
                     "RANKSTREAM_KAFKA_SASL_USERNAME=crawler",
                     "RANKSTREAM_SNAPSHOT_DIR=''", "RANKSTREAM_GROUP_ID=g1"):
        assert f"export {exported}" in lines, exported
    assert "k-s3cret" not in text
    assert "# the Kafka password is not exported: set RANKSTREAM_KAFKA_SASL_PASSWORD" in lines


def test_status_does_not_call_another_broker_ours(tmp_path: Path) -> None:
    """Ours listened on 19092, the settings named 19094: whatever answered there was
    reported as ours, with our pid (Redis' status already said where ours is)."""
    svc = _our_broker(tmp_path, started_on=19092, configured=19094)
    settings = load_settings(kafka_bootstrap="127.0.0.1:19094", state_dir=tmp_path,
                             cache_dir=tmp_path)
    with mock.patch.object(stack, "kafka_pid", return_value=4243), \
            mock.patch.object(stack, "kafka_answers", return_value=True), \
            mock.patch.object(stack, "topic_partitions", return_value={}):
        state = stack._kafka_status(svc, settings)
    assert (state.owner, state.pid) == ("external", None)
    assert "ours (pid 4243) listens on 127.0.0.1:19092" in state.detail


def test_topic_creation_retries_only_while_kafka_is_unreachable(tmp_path: Path) -> None:
    """A refusal (a name colliding with another through '.' and '_') was retried for
    the whole timeout, 120 s by default, before it was said."""
    import time

    from rankstream.errors import ServiceUnavailable

    svc = stack.local_services(load_settings(state_dir=tmp_path, cache_dir=tmp_path))
    refusal = ServiceError("creating topics: InvalidTopicError")
    with mock.patch.object(stack, "ensure_topics", side_effect=refusal) as ensure:
        started = time.monotonic()
        with pytest.raises(ServiceError, match="InvalidTopicError"):
            stack._create_topics(svc, timeout=30.0, log=print)
    assert ensure.call_count == 1 and time.monotonic() - started < 5
    unreachable = [ServiceUnavailable("no broker yet"), ["rankstream.links"]]
    with mock.patch.object(stack, "ensure_topics", side_effect=unreachable) as ensure, \
            mock.patch.object(stack.time, "sleep"):
        stack._create_topics(svc, timeout=30.0, log=print)
    assert ensure.call_count == 2
