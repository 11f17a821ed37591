"""Contracts of the CLI and tooling layers that no test pinned down until a mutation
review (each test here kills a mutant the unit suite let through): `rank`'s input
rules and output order, `status --check`'s rules, settings parsing, the services
scripts' process checks, the producer's keys and bootstrap list."""

from __future__ import annotations

import argparse
import gzip
import logging
import os

import pytest

from rankstream.cli import main

FIG = "a\tb\nb\tc\nc\ta\nd\ta\n"


def _run(argv, capsys):
    code = main(argv)
    return code, capsys.readouterr()


# --- rank / edge lists -------------------------------------------------------
def test_rank_skips_whitespace_only_lines_as_blank(tmp_path, capsys):
    edges = tmp_path / "e.tsv"
    edges.write_text("a\tb\n   \n\t\nb\ta\n")
    code, out = _run(["rank", "--edges", str(edges)], capsys)
    assert code == 0, out.err


def test_a_truncated_gzip_names_the_line_it_could_not_read(tmp_path):
    from rankstream.errors import InputError
    from rankstream.input_files import numbered_lines
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gzip.compress(b"a\tb\n" * 50_000)[:-40])
    numbers: list[int] = [0]
    with pytest.raises(InputError) as info:
        for number, _ in numbered_lines(cut):
            numbers.append(number)
    read = numbers[-1]  # the last line read whole: the error names the next one
    assert str(info.value).startswith(f"{cut}:{read + 1}:"), (read, str(info.value))


def test_rank_refuses_an_edge_line_with_an_empty_target(tmp_path, capsys):
    edges = tmp_path / "e.tsv"
    edges.write_text("a\tb\nc\t\n")
    code, out = _run(["rank", "--edges", str(edges)], capsys)
    assert code == 2 and "e.tsv:2: expected 'src<TAB>dst'" in out.err


def test_rank_refuses_batch_size_zero(tmp_path, capsys):
    edges = tmp_path / "e.tsv"
    edges.write_text(FIG)
    code, out = _run(["rank", "--edges", str(edges), "--batch-size", "0"], capsys)
    assert code == 2 and "--batch-size must be" in out.err


def test_rank_refuses_a_hits_tolerance_of_1_or_more(tmp_path, capsys):
    edges = tmp_path / "e.tsv"
    edges.write_text(FIG)
    code, out = _run(["rank", "--edges", str(edges), "--algorithm", "hits",
                      "--tolerance", "1.5"], capsys)
    assert code == 2 and "--tolerance must lie strictly between 0 and 1" in out.err


def test_rank_breaks_ties_by_key(tmp_path, capsys):
    edges = tmp_path / "e.tsv"
    edges.write_text("z\tq\na\tq\n")
    code, out = _run(["rank", "--edges", str(edges)], capsys)
    assert code == 0
    assert [line.split("\t")[0] for line in out.out.splitlines()] == ["q", "a", "z"]


def test_rank_hits_rows_are_by_authority_and_top_is_k(tmp_path, capsys):
    edges = tmp_path / "e.tsv"
    edges.write_text(FIG)
    code, out = _run(["rank", "--edges", str(edges), "--algorithm", "hits"], capsys)
    assert code == 0
    assert [line.split("\t")[0] for line in out.out.splitlines()] == ["a", "b", "c", "d"]
    code, out = _run(["rank", "--edges", str(edges), "--algorithm", "hits", "--top", "1"], capsys)
    assert code == 0 and len(out.out.splitlines()) == 1


# --- status --check ----------------------------------------------------------
def _raw(lock_host="h", lag="0"):
    from datetime import UTC, datetime
    consumer = {"state": "running", "heartbeat_at": datetime.now(UTC).isoformat(),
                "pid": "1", "host": "h"}
    if lag is not None:
        consumer["lag_total"] = lag
    return {"lock": {"pid": 1, "host": lock_host}, "consumer": consumer,
            "algorithms": {}, "graph": {}}


def _problems(raw, **kw):
    from consumer.commands.status import problems
    return problems(raw, max_age_s=60.0, max_lag=kw.get("max_lag"), fresh=False)


def test_status_check_lag_equal_to_the_limit_is_healthy():
    assert _problems(_raw(lag="100"), max_lag=100) == []
    assert _problems(_raw(lag="0"), max_lag=0) == []


def test_status_check_same_pid_on_another_host_is_not_the_holder():
    assert _problems(_raw(lock_host="other")) == [
        "status not written by the lease holder (pid 1 on other)"]


def test_status_check_missing_lag_is_unknown_not_zero():
    assert _problems(_raw(lag=None), max_lag=10) == ["lag unknown"]


def test_status_check_max_lag_zero_is_allowed():
    from consumer.commands.status import check_options
    check_options(argparse.Namespace(max_age=60.0, max_lag=0, check=True, fresh=False))


def _no_consumer(monkeypatch):
    """`rankstream status` reading a prefix whose lease nobody holds (no Redis)."""
    import consumer.commands.status as st

    class Client:
        def hmget(self, key, fields):  # P graph: this layout, no rekey cut short
            return [None for _ in fields]

        def close(self):
            pass
    raw = _raw()
    raw["lock"] = None
    raw["running"] = False
    monkeypatch.setattr(st, "connect_redis", lambda *a, **k: Client())
    monkeypatch.setattr(st, "status", lambda client, prefix: raw)


def test_plain_status_exits_0_even_when_unhealthy(monkeypatch, capsys):
    _no_consumer(monkeypatch)
    assert main(["status"]) == 0
    assert main(["status", "--check"]) == 1


def test_status_prometheus_prints_the_exposition_and_keeps_the_check(monkeypatch, capsys):
    _no_consumer(monkeypatch)
    assert main(["status", "--prometheus", "--check"]) == 1  # still the probe's code
    out = capsys.readouterr().out
    assert "rankstream_consumer_running 0.0\n" in out and 'state="running"' in out
    with pytest.raises(SystemExit) as exit_info:  # argparse's misuse exit, one line
        raise SystemExit(main(["status", "--json", "--prometheus"]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("argument --prometheus: not allowed with argument --json")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(("new_prefix", "message"), [
    ("rs:", "must not be one the start of the other"),  # the current prefix itself
    ("rs:v2:", "must not be one the start of the other"),  # deleting rs:* would take it
    ("r", "must not be one the start of the other"),
    ("x:term:", "has a 'term' segment"),  # the settings' own rule for a prefix
])
def test_rekey_refuses_a_prefix_that_would_mix_keys(new_prefix, message, monkeypatch,
                                                    capsys):
    # Refused before any Redis command (nothing listens at port 1).
    monkeypatch.setenv("RANKSTREAM_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("RANKSTREAM_KEY_PREFIX", "rs:")
    assert main(["rekey", new_prefix]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


# --- settings ------------------------------------------------------------------
def test_soak_knobs_are_not_warned_of(monkeypatch, caplog):
    from rankstream.settings import load_settings
    monkeypatch.setenv("RANKSTREAM_SOAK_SECONDS", "60")
    with caplog.at_level(logging.WARNING):
        load_settings()
    assert caplog.records == []


def test_an_at_sign_in_the_password_stays_in_the_password():
    from rankstream.settings import load_settings
    s = load_settings(redis_url="redis://u:p@ss@h:6379/0")
    assert s.redis_password.get_secret_value() == "p@ss"
    assert s.redis_url == "redis://h:6379/0"


def test_port_zero_is_refused():
    from rankstream.errors import ConfigError
    from rankstream.settings import load_settings
    with pytest.raises(ConfigError, match="KAFKA_BOOTSTRAP"):
        load_settings(kafka_bootstrap="127.0.0.1:0")


# --- services (pure) -----------------------------------------------------------
def test_all_of_127_8_is_loopback():
    from rankstream.services._proc import is_loopback
    assert is_loopback("127.0.1.1")


def test_whole_argument_does_not_match_a_prefix(tmp_path):
    from rankstream.services._proc import command_args, live_pid
    pid_file = tmp_path / "x.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    arg = command_args(os.getpid())[0]
    assert live_pid(pid_file, arg, whole_argument=True) == os.getpid()
    assert live_pid(pid_file, arg[:-1], whole_argument=True) is None


def test_a_service_is_alive_until_its_last_thread_ends():
    """A JVM's main thread exits before its others, which still hold the broker's
    sockets: /proc shows a zombie with threads, and `up` must wait for it, not start a
    second broker on a port still bound. Stopped (SIGSTOP) is alive too; killed is not."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from rankstream.services._proc import process_alive
    main_exits = ("import ctypes, threading, time; "
                  "threading.Thread(target=time.sleep, args=(60,)).start(); "
                  "ctypes.CDLL(None).pthread_exit(None)")
    for argv, prepare in (([sys.executable, "-c", main_exits], None),
                          (["sleep", "60"], signal.SIGSTOP)):
        process = subprocess.Popen(argv)
        try:
            status = Path(f"/proc/{process.pid}/status")
            deadline = time.monotonic() + 10
            if prepare is not None:
                process.send_signal(prepare)
            wanted = "State:\tT" if prepare is not None else "State:\tZ"
            while wanted not in status.read_text():
                assert time.monotonic() < deadline, status.read_text()
                time.sleep(0.02)
            assert process_alive(process.pid)
        finally:
            process.kill()
            process.wait()
        assert not process_alive(process.pid)


def test_a_garbled_pid_file_is_no_pid(tmp_path):
    from rankstream.services._proc import read_pid
    (tmp_path / "p").write_text("12ab\n")
    assert read_pid(tmp_path / "p") is None


def test_ipv6_bootstrap_and_topic_size_limit():
    from rankstream.services import stack
    from rankstream.settings import load_settings
    settings = load_settings(kafka_bootstrap="[::1]:9092")
    assert stack.local_services(settings).kafka.host == "::1"
    for spec in stack.topic_specs(settings):
        assert int(spec.configs["max.message.bytes"]) > 2 * settings.max_message_bytes


# --- producer --------------------------------------------------------------------
def test_events_are_keyed_by_their_source(monkeypatch):
    import kafka
    sent = []

    class Future:
        def add_callback(self, f):
            f(None)

        def add_errback(self, f):
            pass

    class FakeProducer:
        def __init__(self, **kw):
            pass

        def send(self, topic, value=None, key=None):
            sent.append(key)
            return Future()

        def flush(self, timeout=None):
            pass

        def close(self, timeout=None):
            pass
    monkeypatch.setattr(kafka, "KafkaProducer", FakeProducer)
    from producer.client import LinkPublisher
    with LinkPublisher("127.0.0.1:9", "t") as pub:
        pub.publish_page("https://a.org/", ["https://b.org/"])
        pub.publish_link_added("https://c.org/", "https://d.org/")
        pub.publish_page_removed("https://e.org/")
    assert sent == [b"https://a.org/", b"https://c.org/", b"https://e.org/"]


def test_synthetic_ts_increase_by_the_step():
    from producer.synthetic import synthetic_event_dicts
    ts = [e["ts"] for e in synthetic_event_dicts(50, ts_start_ms=1000, ts_step_ms=7)]
    assert ts == [1000 + 7 * i for i in range(50)]


def test_rank_breaks_ties_by_key_across_edges_and_events(tmp_path, capsys):
    import json
    edges = tmp_path / "e.tsv"
    edges.write_text("https://z.org/\thttps://q.org/\n")
    events = tmp_path / "ev.jsonl"
    events.write_text(json.dumps({"type": "link_added", "src": "https://a.org/",
                                  "dst": "https://q.org/"}) + "\n")
    code, out = _run(["rank", "--edges", str(edges), "--events", str(events)], capsys)
    assert code == 0, out.err
    assert [line.split("\t")[0] for line in out.out.splitlines()] == [
        "https://q.org/", "https://a.org/", "https://z.org/"]


def test_a_bootstrap_list_is_split(monkeypatch):
    import kafka
    seen = {}

    class FakeProducer:
        def __init__(self, **kw):
            seen.update(kw)
    monkeypatch.setattr(kafka, "KafkaProducer", FakeProducer)
    from producer.client import LinkPublisher
    LinkPublisher("a:1, b:2,", "t")
    assert seen["bootstrap_servers"] == ["a:1", "b:2"]
