"""Misuse of the commands beside `rank` (tests/unit/test_rank_command.py has its own):
one line on stderr and exit 2, found before any service is asked (a session-27 review).

Every test points Kafka and Redis at a closed port, so a check that failed to fire
would show as a connection error, never as a write to a running service.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from rankstream.cli import main, one_line

FIG2 = "A\tB\nA\tC\nB\tC\nC\tA\nC\tB\n"
CLOSED = "127.0.0.1:1"


@pytest.fixture(autouse=True)
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RANKSTREAM_REDIS_URL", f"redis://{CLOSED}/0")
    monkeypatch.setenv("RANKSTREAM_KAFKA_BOOTSTRAP", CLOSED)
    monkeypatch.chdir(tmp_path)  # no .env of the developer's


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("argv, message", [
    # NaN passed `<= 0` and the consumer never stopped.
    (["consume", "--max-seconds", "nan"], "--max-seconds must be positive"),
    (["services", "status", "--timeout", "nan"], "--timeout must be a positive"),
    (["services", "down", "--timeout", "-1"], "--timeout must be a positive"),
    # A numpy traceback once the topics were created; 3e9 a silent out-of-memory kill.
    (["produce", "--synthetic", "100000000000000000000000000"], "more than 100,000,000 links"),
    (["produce", "--synthetic", "20000000"], "(the synthetic graph is built in memory first)"),
    # Redis refused the EX and the best-effort cache write cached nothing, silently.
    (["hits", "python", "--cache-ttl", "99999999999999999999"], "--cache-ttl"),
    (["serve", "--cache-ttl", "86401"], "must be an integer in [1, 86400]"),
    (["serve", "--cache-ttl", "0"], "must be an integer in [1, 86400]"),
    # Past Redis' range the lease refused it as "redis: cannot take the consumer lock".
    (["consume", "--lock-ttl-ms", "99999999999999999999"], "between 1000 and 86400000"),
])
def test_bad_arguments_are_refused_before_connecting(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(argv, capsys)
    assert message in err and "connect" not in err


@pytest.mark.parametrize("name, value", [
    ("REDIS_URL", "redis://a..b:6379/0"),
    ("REDIS_URL", f"redis://{'x' * 64}.example:6379/0"),
    ("KAFKA_BOOTSTRAP", "a..b:9092"),
    ("KAFKA_BOOTSTRAP", f"127.0.0.1:9092,{'x' * 64}:9092"),
])
def test_host_names_no_resolver_takes_are_a_bad_setting(
        name: str, value: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """getaddrinfo raised UnicodeError for them: a traceback in every command."""
    monkeypatch.setenv(f"RANKSTREAM_{name}", value)
    err = one_line_error(["status"], capsys)
    assert f"bad setting RANKSTREAM_{name}: bad host name" in err


def test_a_ca_file_without_tls_is_a_bad_setting(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """redis-py handed it to a plain connection, which refused it with a TypeError."""
    (tmp_path / "ca.pem").write_text("")
    monkeypatch.setenv("RANKSTREAM_REDIS_SSL_CA_CERTS", str(tmp_path / "ca.pem"))
    err = one_line_error(["status"], capsys)
    assert "bad settings: RANKSTREAM_REDIS_SSL_CA_CERTS needs a rediss://" in err


def test_a_unix_socket_url_connects_like_any_other(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """socket_keepalive, given to every client, made a unix socket's a TypeError."""
    monkeypatch.setenv("RANKSTREAM_REDIS_URL", f"unix://{tmp_path}/none.sock")
    err = one_line_error(["status"], capsys)
    assert "redis unavailable" in err and "none.sock" in err


def test_an_env_file_line_that_does_not_parse_is_named(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """python-dotenv skipped it with a warning: the rank ran at the default damping."""
    (tmp_path / "good.tsv").write_text(FIG2)
    (tmp_path / ".env").write_text('# ours\nRANKSTREAM_DAMPING="0.5\n')
    err = one_line_error(["rank", "--edges", "good.tsv"], capsys)
    assert "cannot read the .env file: line 2 is not NAME=value" in err
    assert "0.5" not in err  # the line may hold a password: never shown


def test_a_newline_in_a_path_stays_escaped_on_the_one_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "bad\nname.tsv").write_text("A\tB\nx\n")
    err = one_line_error(["rank", "--edges", str(tmp_path / "bad\nname.tsv")], capsys)
    assert "bad\\nname.tsv:2: expected 'src<TAB>dst'" in err


def test_one_line_escapes_only_what_would_break_the_line() -> None:
    assert one_line("plain: é ü 中") == "plain: é ü 中"
    assert one_line("a\nb\rc\x85d\u2028e\udc80") == "a\\nb\\rc\\x85d\\u2028e\\udc80"


def test_serve_names_a_host_no_resolver_takes() -> None:
    from consumer.serve_cli import _bind
    from rankstream.errors import ServiceError

    for host in ("a..b", "x" * 64):
        with pytest.raises(ServiceError, match="cannot serve on"):
            _bind(host, 0)
    with _bind("127.0.0.1", 0) as listener:
        assert listener.family == socket.AF_INET


def test_consume_with_redis_down_keeps_to_max_seconds(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """It waited its full 60 s for Redis, then warned that it could not release a
    lock it never took."""
    import logging

    from consumer.commands import consume

    # The JSON log to stderr, without its process-wide handler outliving the test.
    def log_to_stderr(level: str) -> None:
        monkeypatch.setattr(logging.getLogger("rankstream"), "handlers",
                            [logging.StreamHandler()])

    monkeypatch.setattr(consume, "setup_json_logging", log_to_stderr)
    started = time.monotonic()
    err = one_line_error(["consume", "--max-seconds", "1"], capsys)
    assert time.monotonic() - started < 20
    assert "redis unavailable" in err and "release" not in err


def test_the_services_entry_point_misused_is_one_line_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m rankstream.services`` (what ./run calls) printed argparse's usage."""
    from rankstream.services.__main__ import main as services_main

    with pytest.raises(SystemExit) as exited:
        services_main(["bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in err and len(err.strip().splitlines()) == 1


def test_stdin_by_two_names_is_one_input(capsys: pytest.CaptureFixture[str]) -> None:
    """``--edges /dev/stdin --events -`` read the edges and then found no events."""
    err = one_line_error(["rank", "--edges", "/dev/stdin", "--events", "-"], capsys)
    assert "--edges and --events name the same input" in err


@pytest.mark.parametrize("argv", [["rank", "--edges", ""], ["produce", ""]])
def test_an_empty_path_is_named(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Path("") is "." and was reported as "cannot read: is a directory"."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "an empty path" in err and len(err.strip().splitlines()) == 1


def test_status_check_names_every_reason_a_consumer_is_not_healthy():
    """`rankstream status --check` exits 1 with the reasons (a probe's answer)."""
    from datetime import UTC, datetime, timedelta

    from consumer.commands.status import problems

    now = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)

    def raw(*, lock=True, state="running", age=1.0, lag="0", fresh=(True, True),
            published=(True, True)):
        beat = (now - timedelta(seconds=age)).isoformat(timespec="milliseconds")
        return {"lock": {"pid": 1, "host": "h"} if lock else None,
                "consumer": {"state": state, "heartbeat_at": beat, "lag_total": lag,
                             "pid": "1", "host": "h"},
                "algorithms": {a: {"published": p, "fresh": f} for a, p, f
                               in zip(("pagerank", "wpr"), published, fresh, strict=True)}}

    def check(value, **options):
        return problems(value, max_age_s=options.get("max_age_s", 60.0),
                        max_lag=options.get("max_lag"), fresh=options.get("fresh", False),
                        now=now)

    assert check(raw()) == []
    assert check(raw(lock=False, state="running")) == ["no consumer holds the lease"]
    assert check(raw(state="waiting")) == ["consumer state waiting"]
    assert check(raw(age=61.0)) == ["last heartbeat 61 s ago"]
    assert check(raw(age=61.0), max_age_s=90.0) == []
    assert check(raw(lag="5000"), max_lag=100) == ["lag 5000 events"]
    assert check(raw(lag="5000")) == []  # no lag limit asked
    assert check(raw(fresh=(True, False)), fresh=True) == ["wpr scores not fresh"]
    assert check(raw(published=(False, True)), fresh=True) == ["pagerank scores not published"]
    assert check(raw(fresh=(False, False))) == []  # freshness only with --fresh
    broken = raw()
    broken["consumer"] = {}
    assert check(broken) == ["status not written by the lease holder (pid 1 on h)",
                             "consumer state unknown", "no heartbeat"]
    foreign = raw()
    foreign["lock"] = {"raw": "x"}
    assert check(foreign)[0] == "the lease key holds a value that is not rankstream's"
    # A new holder that has not written its status yet: a crashed predecessor's
    # "running" is not this process's (a review).
    successor = raw()
    successor["lock"] = {"pid": 2, "host": "h"}
    assert check(successor) == ["status not written by the lease holder (pid 2 on h)"]
    assert check(raw(age=-61.0)) == ["last heartbeat 61 s in the future: clocks out of sync"]
    assert check(raw(age=-5.0)) == []  # a little skew is no problem


@pytest.mark.parametrize("argv", [
    ["status", "--fresh"], ["status", "--max-lag", "5"], ["status", "--max-age", "9"],
    ["status", "--check", "--max-age", "0"], ["status", "--check", "--max-age", "nan"],
    ["status", "--check", "--max-lag", "-1"],
])
def test_status_check_options_are_checked_before_redis_is_read(argv, capsys):
    from rankstream.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error" in err, err


# --- A session-37 review: streams closed or full, and settings given on the command line


def test_an_os_error_no_command_translated_is_one_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`top > /dev/full` printed a traceback and exited 1 (`status --check`: unhealthy)."""
    import errno
    import sys
    import types

    from rankstream import cli

    fake = types.ModuleType("rankstream_fake_command")
    fake.add_arguments = lambda parser: None  # type: ignore[attr-defined]

    def run(args: object, settings: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    fake.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setitem(cli.COMMANDS, "fake", (fake.__name__, "a command that fails"))
    err = one_line_error(["fake"], capsys)
    assert "rankstream fake: error: No space left on device" in err


def _shell(command: str, tmp_path: Path) -> tuple[int, str]:
    """``command`` run by sh with ``RANKSTREAM`` meaning our entry point."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root),
           "RANKSTREAM": f"{sys.executable} -m rankstream.cli"}
    done = subprocess.run(["sh", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    return done.returncode, done.stderr


def test_closed_or_full_standard_streams_are_errors_not_tracebacks(tmp_path: Path) -> None:
    (tmp_path / "good.tsv").write_text(FIG2)
    code, err = _shell("$RANKSTREAM rank --edges - <&-", tmp_path)
    assert code == 2 and err == "rankstream rank: error: -: cannot read: standard input is closed\n"
    code, err = _shell("$RANKSTREAM produce - <&-", tmp_path)  # before any connection
    assert code == 2 and "standard input is closed" in err and "connect" not in err
    # stderr closed: still exit 2 (it was 1, which `status --check` means as unhealthy)
    code, _ = _shell("$RANKSTREAM rank --edges missing.tsv 2>&-", tmp_path)
    assert code == 2
    code, err = _shell("$RANKSTREAM rank --edges good.tsv > /dev/full", tmp_path)
    assert code == 2 and err.count("\n") == 1 and "No space left on device" in err


def test_a_file_named_dash_is_reached_as_dot_slash_dash(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Path("./-") is Path("-"): the file's graph was ignored and stdin read instead."""
    (tmp_path / "-").write_text(FIG2)
    assert main(["rank", "--edges", "./-"]) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == [
        "C", "B", "A"]


@pytest.mark.parametrize("argv, message", [
    # model_copy validated nothing: the events went into the dead-letter topic.
    (["produce", "--synthetic", "2", "--topic", "rankstream.links.dlq"],
     "bad --topic: RANKSTREAM_TOPIC and RANKSTREAM_DLQ_TOPIC must differ"),
    # Read the settings a second time and blamed RANKSTREAM_KEY_PREFIX, never set.
    (["rekey", "x:term:"], "bad NEW_PREFIX: 'x:term:' has a 'term' segment"),
])
def test_command_line_overrides_keep_the_settings_rules(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(argv, capsys)
    assert message in err and "connect" not in err


@pytest.mark.parametrize("name, value, message", [
    # Above int32 kafka-python's request encoding raised a ValueError traceback.
    ("TOPIC_PARTITIONS", "99999999999", "Input should be less than or equal to 2147483647"),
    # Path("") is ".": the services' data or jars in the working directory.
    ("STATE_DIR", "", "empty: unset it for the default"),
    ("CACHE_DIR", " ", "empty: unset it for the default"),
])
def test_settings_out_of_range_or_empty_are_named(
        name: str, value: str, message: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "good.tsv").write_text(FIG2)
    monkeypatch.setenv(f"RANKSTREAM_{name}", value)
    err = one_line_error(["rank", "--edges", "good.tsv"], capsys)
    assert f"bad setting RANKSTREAM_{name}: {message}" in err


def test_an_empty_ca_file_setting_is_unset(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """`RANKSTREAM_REDIS_SSL_CA_CERTS=${CA:-}` asked for TLS: every command failed."""
    (tmp_path / "good.tsv").write_text(FIG2)
    monkeypatch.setenv("RANKSTREAM_REDIS_SSL_CA_CERTS", "")
    monkeypatch.setenv("RANKSTREAM_KAFKA_SSL_CAFILE", "")
    assert main(["rank", "--edges", "good.tsv"]) == 0
    from rankstream.settings import load_settings

    settings = load_settings()
    assert settings.redis_ssl_ca_certs is None and settings.kafka_ssl_cafile is None


@pytest.mark.parametrize("values, message", [
    # kafka-python failed when connecting: KeyError(None), or AttributeError on None.
    ({"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"},
     "SASL_PLAINTEXT needs RANKSTREAM_KAFKA_SASL_MECHANISM, _SASL_USERNAME and _SASL_PASSWORD"),
    ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-256"},
     "SASL_SSL needs RANKSTREAM_KAFKA_SASL_MECHANISM"),
    ({"KAFKA_SASL_MECHANISM": "PLAIN"}, "needs a SASL_PLAINTEXT or SASL_SSL"),
])
def test_incomplete_sasl_settings_are_named(
        values: dict[str, str], message: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in values.items():
        monkeypatch.setenv(f"RANKSTREAM_{name}", value)
    err = one_line_error(["produce", "--synthetic", "3"], capsys)
    assert "bad settings: " in err and message in err and "connect" not in err
