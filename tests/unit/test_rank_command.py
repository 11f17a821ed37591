"""`rankstream rank`: the offline command, end to end through cli.main."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from rankstream.cli import main
from rankstream.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
# A copy of ../shared/data/python-docs-links.tsv.gz, so that a bare clone checks it too.
DOCS_EDGES = REPO / "data" / "python-docs-links.tsv.gz"
DEMO_EVENTS = REPO / "data" / "python-docs-pages.jsonl.gz"
FIG2 = "A\tB\nA\tC\nB\tC\nC\tA\nC\tB\n"


def _rows(text: str) -> dict[str, list[float]]:
    return {
        fields[0]: [float(v) for v in fields[1:]]
        for fields in (line.split("\t") for line in text.splitlines())
    }


def test_fig2_paper_scale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edges = tmp_path / "fig2.tsv"
    edges.write_text(FIG2)
    assert main(["rank", "--edges", str(edges)]) == 0
    out = capsys.readouterr().out
    assert [line.split("\t")[0] for line in out.splitlines()] == ["C", "B", "A"]
    rows = _rows(out)
    assert rows["A"][0] == pytest.approx(0.701754, abs=1e-6)
    assert rows["B"][0] == pytest.approx(1.0, abs=1e-6)
    assert rows["C"][0] == pytest.approx(1.298246, abs=1e-6)


def test_probability_scale_gzip_matches_networkx(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edges = [(1, 2), (1, 3), (3, 1), (3, 2), (3, 5), (4, 5), (4, 6), (5, 4), (5, 6), (6, 4)]
    path = tmp_path / "nx.tsv.gz"
    with gzip.open(path, "wt") as handle:
        handle.writelines(f"{u}\t{v}\n" for u, v in edges)
    assert main(["rank", "--edges", str(path), "--damping", "0.9", "--scale", "probability"]) == 0
    rows = _rows(capsys.readouterr().out)
    expected = nx.pagerank(nx.DiGraph(edges), alpha=0.9, tol=1e-13)
    for node, value in expected.items():
        assert rows[str(node)][0] == pytest.approx(value, abs=1e-9)


def test_events_on_top_equal_cold_solve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edges = tmp_path / "fig2.tsv"
    edges.write_text(FIG2)
    events = tmp_path / "events.jsonl"
    lines = [
        {"type": "link_added", "src": "https://x.org/", "dst": "https://y.org/"},
        {"type": "page", "url": "https://y.org/", "links": ["https://x.org/"]},
        {"type": "link_removed", "src": "https://x.org/", "dst": "https://y.org/"},
        {"type": "page_removed", "url": "https://y.org/"},
        {"type": "link_added", "src": "https://z.org/", "dst": "https://x.org/"},
    ]
    events.write_text("".join(json.dumps(line) + "\n" for line in lines))
    for algorithm in ("pagerank", "wpr"):
        argv = ["rank", "--edges", str(edges), "--events", str(events), "--batch-size", "2",
                "--algorithm", algorithm, "--verify"]
        assert main(argv) == 0
        captured = capsys.readouterr()
        rows = _rows(captured.out)
        assert "https://y.org/" not in rows  # removed pages are not ranked
        assert set(rows) == {"A", "B", "C", "https://x.org/", "https://z.org/"}
        diff = float(captured.err.split("=")[1].split()[0])
        assert diff <= 1e-9


@pytest.mark.parametrize("batch_size", [1, 2])
def test_edge_list_sources_count_as_crawled_and_targets_do_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], batch_size: int) -> None:
    # a's only line is a self link (dropped), d's in-link goes: a was crawled (it is a
    # source), d never was (the orphan rule removes it); neither depends on batching.
    a, b, c, d, x = (f"https://{name}.org/" for name in "abcdx")
    edges = tmp_path / "edges.tsv"
    edges.write_text(f"{a}\t{a}\n{b}\t{c}\n{b}\t{d}\n")
    events = tmp_path / "events.jsonl"
    lines = [{"type": "link_added", "src": x, "dst": a},
             {"type": "link_removed", "src": x, "dst": a},
             {"type": "link_removed", "src": b, "dst": d}]
    events.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["rank", "--edges", str(edges), "--events", str(events),
            "--batch-size", str(batch_size)]
    assert main(argv) == 0
    assert set(_rows(capsys.readouterr().out)) == {a, b, c, x}


def test_verify_at_high_damping_certifies_rather_than_stalls(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The cold solve's fixed tolerance sat under the float64 floor, which grows as
    # 1 / (1 - d): it stalled, exit 2, with nothing the user could change.
    # Every page links out (no mass leaks): sum(y) is the page count, the floor highest.
    rng = np.random.default_rng(7)
    edges = tmp_path / "random.tsv"
    edges.write_text("".join(
        f"p{a}\tp{b}\n" for a in range(300)
        for b in rng.choice([p for p in range(300) if p != a], 3, replace=False)))
    assert main(["rank", "--edges", str(edges), "--damping", "0.9999", "--verify"]) == 0
    assert "verify: max |incremental - cold|" in capsys.readouterr().err


def test_verify_gives_its_cold_solve_the_sweeps_a_high_damping_needs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """networkx's test graph at d = 0.999 needs about 24k Jacobi sweeps: a fixed
    10,000 made ``--verify`` exit 2 where ``rank`` alone succeeded (a review)."""
    edges = tmp_path / "nx.tsv"
    edges.write_text("".join(f"{a}\t{b}\n" for a, b in [
        (1, 2), (1, 3), (3, 1), (3, 2), (3, 5), (4, 5), (4, 6), (5, 4), (5, 6), (6, 4)]))
    assert main(["rank", "--edges", str(edges), "--damping", "0.999", "--verify"]) == 0
    assert "verify: max |incremental - cold|" in capsys.readouterr().err


def test_a_damping_too_close_to_1_is_named_not_a_tolerance_never_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edges = tmp_path / "fig2.tsv"
    edges.write_text(FIG2)
    assert main(["rank", "--edges", str(edges), "--damping", "0.99999999999999"]) == 2
    err = capsys.readouterr().err
    assert "damping 0.99999999999999 is too close to 1" in err and len(err.splitlines()) == 1
    # HITS has no damping: the setting does not concern it.
    assert main(["rank", "--edges", str(edges), "--damping", "0.99999999999999",
                 "--algorithm", "hits"]) == 0


def test_verify_fails_when_the_certificates_do_not_cover_the_difference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from ranker import LiveRanks

    edges = tmp_path / "fig2.tsv"
    edges.write_text(FIG2)
    right = LiveRanks.scores
    monkeypatch.setattr(LiveRanks, "scores", lambda self, alg: right(self, alg) + 1e-6)
    assert main(["rank", "--edges", str(edges), "--verify"]) == 1
    err = capsys.readouterr().err
    assert "verify FAILED" in err
    assert "Traceback" not in err


def test_hits_says_what_verify_means_for_it(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    edges = tmp_path / "fig2.tsv"
    edges.write_text(FIG2)
    assert main(["rank", "--edges", str(edges), "--algorithm", "hits", "--verify"]) == 0
    assert "HITS has no incremental path" in capsys.readouterr().err


def test_hits_prints_hub_and_authority(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edges = tmp_path / "fig2.tsv"
    edges.write_text(FIG2)
    assert main(["rank", "--edges", str(edges), "--algorithm", "hits"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["A"] == pytest.approx([0.736976, 0.327985], abs=1e-6)
    assert rows["B"] == pytest.approx([0.327985, 0.736976], abs=1e-6)


def test_python_docs_graph_verifies_within_1e9(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rank", "--edges", str(DOCS_EDGES), "--verify", "--top", "3"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 3
    assert float(captured.err.split("=")[1].split()[0]) <= 1e-9


def test_demo_events_replay_verifies(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["rank", "--events", str(DEMO_EVENTS), "--batch-size", "100", "--verify", "--top", "1"]
    assert main(argv) == 0
    assert float(capsys.readouterr().err.split("=")[1].split()[0]) <= 1e-9


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["rank", "--edges", "/nonexistent.tsv"], "no such file"),
        (["rank", "--edges", "{bad}", "--algorithm", "pagerankk"], "unknown algorithm"),
        (["rank", "--edges", "{bad}"], "bad.tsv:3: expected 'src<TAB>dst'"),
        (["rank", "--edges", "{good}", "--algorithm", "wpr", "--scale", "probability"],
         "PageRank only"),
        (["rank"], "give --edges"),
        (["rank", "--edges", "{good}", "--damping", "1.5"], "damping"),
        (["rank", "--edges", "{good}", "--batch-size", "x"], "invalid int value"),
        (["rank", "--events", "{badevents}"], "badevents.jsonl:2"),
        (["rank", "--edges", "{good}", "--top", "0"], "--top must be at least 1"),
        (["rank", "--edges", "{good}", "--tolerance", "1e-16"], "float64 rounding"),
        (["rank", "--edges", "{good}", "--top", "-1"], "--top must be at least 1"),
        # Decoded line by line: a chunked decoder would name a line ~1000 too early.
        (["rank", "--edges", "{late}"], "late.tsv:3001: not UTF-8"),
        (["rank", "--edges", "{truncated}"], "cut.tsv.gz:"),
        (["produce", "--synthetic", "5", "--links-per-page", "nan"], "--links-per-page"),
        (["produce", "--synthetic", "5", "--seed", "-5"], "--seed must be >= 0"),
        # Checked before connecting: an empty name is not "no --topic" (the default).
        (["produce", "--synthetic", "5", "--topic", ""], "--topic: bad topic name"),
        (["produce", "--synthetic", "5", "--topic", "a b"], "--topic: bad topic name"),
        # An endless line is refused by its number, not read whole into memory.
        (["rank", "--edges", "{endless}"], "endless.tsv:1: line longer than 1048576 bytes"),
        (["rank", "--edges", "{good}", "--batch-size", str(10**20)], "--batch-size must be"),
        # Whichever is read first would take the whole stream, the other nothing.
        (["rank", "--edges", "-", "--events", "-"], "name the same input"),
        (["rank", "--edges", "{good}", "--algorithm", "hits", "--tolerance", "1e-300"],
         "at least 1e-12 for HITS"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "bad.tsv").write_text("a\tb\n# comment\nc\n")
    (tmp_path / "good.tsv").write_text(FIG2)
    (tmp_path / "badevents.jsonl").write_text('{"type":"page","url":"https://a.org/","links":[]}\n{')
    (tmp_path / "late.tsv").write_bytes(b"a\tb\n" * 3000 + b"x\xff\ty\n")
    (tmp_path / "cut.tsv.gz").write_bytes(gzip.compress(b"a\tb\n" * 50_000)[:-40])
    (tmp_path / "endless.tsv").write_bytes(b"\0" * (3 << 20))
    paths = {
        "{endless}": str(tmp_path / "endless.tsv"),
        "{late}": str(tmp_path / "late.tsv"),
        "{truncated}": str(tmp_path / "cut.tsv.gz"),
        "{bad}": str(tmp_path / "bad.tsv"),
        "{good}": str(tmp_path / "good.tsv"),
        "{badevents}": str(tmp_path / "badevents.jsonl"),
    }
    argv = [paths.get(arg, arg) for arg in argv]
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_events_report_how_many_were_applied_and_how_many_were_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "stale.jsonl"
    log.write_text("".join(json.dumps({"type": "page", "url": "https://a.org/", "ts": ts,
                                       "links": [f"https://b.org/{ts}"]}) + "\n"
                           for ts in (2000, 1000, 3000, 1500)))
    assert main(["rank", "--events", str(log)]) == 0
    captured = capsys.readouterr()
    assert "events: 2 applied, 2 stale ignored" in captured.err
    assert "https://b.org/3000\t0.2775" in captured.out  # the newest crawl's link
    assert "b.org/1000" not in captured.out and "b.org/1500" not in captured.out


def test_a_failed_write_of_the_output_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class FullDisk:
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

    (tmp_path / "good.tsv").write_text(FIG2)
    monkeypatch.setattr("sys.stdout", FullDisk())
    assert main(["rank", "--edges", str(tmp_path / "good.tsv")]) == 2
    assert capsys.readouterr().err == (
        "rankstream rank: error: cannot write the output: No space left on device\n")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("ALLOWED_SCHEMES", '["http"', "not a JSON list"),
        ("ALLOWED_SCHEMES", "[" * 100_000, "nested too deeply"),
        ("ALLOWED_SCHEMES", "[]", "give at least one scheme"),
        ("ALLOWED_SCHEMES", "http,,https", "no empty entries"),
        ("ALLOWED_SCHEMES", "ht tp", "not a URL scheme: 'ht tp'"),
        # Each would pass a lower bound alone: an infinite tolerance would call any
        # vector fresh, an infinite work cap crashed the first capped refresh.
        ("TOLERANCE", "inf", "less than 1"),
        ("BATCH_MAX_SWEEPS", "inf", "finite number"),
        ("PUBLISH_THRESHOLD", "nan", "finite number"),
        # kafka-python failed on these with an AssertionError, a KeyError, a ValueError.
        ("KAFKA_BOOTSTRAP", "127.0.0.1:abc", "expected host:port"),
        ("KAFKA_SECURITY_PROTOCOL", "bogus", "'SASL_SSL'"),
        ("KAFKA_SASL_MECHANISM", "BOGUS", "'SCRAM-SHA-512'"),
        # redis-py found these only when connecting, or read "/x" as database 0.
        ("REDIS_URL", "redis://:secret@127.0.0.1:abc/0", "bad port (percent-encode"),
        ("REDIS_URL", "redis://127.0.0.1:70000/0", "bad port"),
        ("REDIS_URL", "redis://127.0.0.1:6379/x", "the database must be a number"),
        ("REDIS_URL", "redis://:s3cr/secret@localhost:6379/0", "bad port"),
        ("REDIS_URL", "redis://:se#cret@localhost:6379/0", "bad port"),
        ("REDIS_URL", "http://127.0.0.1:6379/0", "must be redis://host:port/db"),
        # Non-UTF-8 bytes in the environment: a traceback from every Redis call.
        ("KEY_PREFIX", "rs\udcff:", "not valid UTF-8"),
        ("REDIS_PASSWORD", "\udcff", "not valid UTF-8"),
        # Checked by the first broker call only (produce waited 30 s for none).
        ("TOPIC", "bad topic", "not a Kafka topic name"),
        ("DLQ_TOPIC", "", "not a Kafka topic name"),
        ("TOPIC", "..", "not a Kafka topic name"),
        # Deployment "rs:"'s postings of "lock", "graph", "offsets" were these keys.
        ("KEY_PREFIX", "rs:term:", "has a 'term' segment"),
        # "damping 1" before, and blamed on a tolerance nobody set.
        ("DAMPING", "0.9999999999999", "0.9999999999999 is too close to 1"),
    ],
)
def test_a_bad_setting_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    name: str, value: str, message: str,
) -> None:
    (tmp_path / "good.tsv").write_text(FIG2)
    monkeypatch.setenv(f"RANKSTREAM_{name}", value)
    assert main(["rank", "--edges", str(tmp_path / "good.tsv")]) == 2
    err = capsys.readouterr().err
    assert f"bad setting RANKSTREAM_{name}" in err and message in err
    assert len(err.strip().splitlines()) == 1
    assert "secret" not in err


def test_an_env_file_that_is_not_utf8_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "good.tsv").write_text(FIG2)
    (tmp_path / ".env").write_bytes(b"RANKSTREAM_DAMPING=0.8\xff\n")
    monkeypatch.chdir(tmp_path)
    assert main(["rank", "--edges", "good.tsv"]) == 2
    err = capsys.readouterr().err
    assert "cannot read the .env file: not UTF-8" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("where", "line", "message"), [
    ("file", "RANKSTREAM_DAMPLING=0.5", "unknown setting RANKSTREAM_DAMPLING (did you mean "
                                        "RANKSTREAM_DAMPING?) in the .env file"),
    ("file", "RANKSTREAM_DAMPING:0.5", "line 1 is not NAME=value"),
    ("file", "RANKSTREAM_DAMPING", "line 1 is not NAME=value"),
    ("both", "RANKSTREAM_TOPIC=same", "RANKSTREAM_TOPIC and RANKSTREAM_DLQ_TOPIC must differ"),
])
def test_settings_that_would_be_ignored_or_loop_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    where: str, line: str, message: str,
) -> None:
    """A misspelled name or a line without "=" in .env, each silently ignored (the
    rank ran at the default damping); dead letters sent to the event topic would be
    read back and sent again for ever."""
    (tmp_path / "good.tsv").write_text(FIG2)
    monkeypatch.chdir(tmp_path)
    if where == "file":
        (tmp_path / ".env").write_text(line + "\n")
    else:
        monkeypatch.setenv("RANKSTREAM_TOPIC", "same")
        monkeypatch.setenv("RANKSTREAM_DLQ_TOPIC", "same")
    assert main(["rank", "--edges", "good.tsv"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_unknown_names_in_the_environment_are_warned_of_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Other tools put names there a user never chose: Kubernetes gives every pod
    RANKSTREAM_REDIS_SERVICE_HOST and the like for a Service "rankstream-redis" (a
    review: an error there stopped every pod); a misspelling is still named."""
    import logging

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANKSTREAM_DAMPLING", "0.5")
    monkeypatch.setenv("RANKSTREAM_REDIS_SERVICE_HOST", "10.0.0.7")
    monkeypatch.setenv("RANKSTREAM_REDIS_PORT_6379_TCP_ADDR", "10.0.0.7")
    (tmp_path / ".env").write_text("COMPOSE_PROFILES=dev\nDEBUG\nRANKSTREAM_DAMPING=0.8\n")
    with caplog.at_level(logging.WARNING, logger="rankstream.settings"):
        settings = load_settings()
    assert settings.damping == 0.8  # another tool's bare DEBUG line is not ours to refuse
    assert [r.getMessage() for r in caplog.records] == [
        "unknown setting RANKSTREAM_DAMPLING (did you mean RANKSTREAM_DAMPING?) in the "
        "environment: ignored"]


def test_soak_knobs_and_blank_snapshot_dirs_are_not_errors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANKSTREAM_SOAK_SECONDS", "60")  # the soak harness's, not a setting
    monkeypatch.setenv("RANKSTREAM_SNAPSHOT_DIR", " ")
    assert load_settings().snapshot_dir is None  # not a directory named " "
    # A directory name need not be UTF-8 (the text settings must).
    monkeypatch.setenv("RANKSTREAM_SNAPSHOT_DIR", "/tmp/caf\udce9")
    assert load_settings().snapshot_dir == Path("/tmp/caf\udce9")


def test_allowed_schemes_take_a_comma_list_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANKSTREAM_ALLOWED_SCHEMES", "HTTPS, http")
    assert load_settings().allowed_schemes == ("https", "http")
    monkeypatch.setenv("RANKSTREAM_ALLOWED_SCHEMES", '["https"]')
    assert load_settings().allowed_schemes == ("https",)


@pytest.mark.parametrize("algorithm", ["pagerank", "wpr"])
def test_unconverged_scores_are_an_error_not_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    algorithm: str,
) -> None:
    from ranker.synthetic import copying_model_graph

    graph = copying_model_graph(2000, 8.0, seed=3)
    edges = tmp_path / "web.tsv"
    edges.write_text("".join(f"p{s}\tp{d}\n" for s, d in zip(graph.src, graph.dst, strict=True)))
    monkeypatch.setenv("RANKSTREAM_MAX_ITER", "2")
    argv = ["rank", "--edges", str(edges), "--algorithm", algorithm, "--tolerance", "1e-12"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "did not reach --tolerance 1e-12 within 2 sweeps" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_the_settings_floor_of_the_tolerance_is_the_engines() -> None:
    from ranker.bounds import MIN_TOLERANCE
    from rankstream.settings import Settings

    floor = [m.ge for m in Settings.model_fields["tolerance"].metadata if hasattr(m, "ge")]
    assert floor == [MIN_TOLERANCE]


@pytest.mark.parametrize("damping", [0.5, 0.85, 0.99, 0.9999])
def test_the_settings_floor_of_the_tolerance_follows_the_damping_as_the_engines(
    damping: float,
) -> None:
    from ranker.bounds import tolerance_floor
    from rankstream.errors import ConfigError

    floor = tolerance_floor(damping)
    assert load_settings(damping=damping, tolerance=floor).tolerance == floor
    with pytest.raises(ConfigError, match="bad setting RANKSTREAM_TOLERANCE: "):
        load_settings(damping=damping, tolerance=floor * (1 - 1e-9))


def test_a_bad_topic_name_is_a_config_error_before_any_connection() -> None:
    from producer.client import LinkPublisher
    from rankstream.errors import ConfigError

    # Port 9 (discard): nothing is contacted, the name is checked first.
    with pytest.raises(ConfigError, match="bad topic name"):
        LinkPublisher("127.0.0.1:9", "bad topic")


def test_the_shipped_demo_log_is_what_make_demo_data_derives(tmp_path: Path) -> None:
    from producer.make_demo_data import main as make_demo_data

    out = tmp_path / "pages.jsonl.gz"
    assert make_demo_data([str(DOCS_EDGES), str(out)]) == 0
    assert out.read_bytes() == DEMO_EVENTS.read_bytes()


def test_make_demo_data_into_a_directory_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from producer.make_demo_data import main as make_demo_data

    assert make_demo_data([str(DOCS_EDGES), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err


def test_make_demo_data_groups_by_canonical_url_and_names_a_bad_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from producer.make_demo_data import build_demo_lines
    from producer.make_demo_data import main as make_demo_data

    edges = tmp_path / "links.tsv"
    edges.write_text("http://a/\thttp://b/\nHTTP://A/\thttp://c/\n")
    pages = [json.loads(line) for line in build_demo_lines(edges)]
    assert [(p["url"], p["links"]) for p in pages] == [("http://a/", ["http://b/", "http://c/"])]
    edges.write_text("http://a/\thttp://b/\nhttp://a/\tnope\n")
    assert make_demo_data([str(edges), str(tmp_path / "out.jsonl.gz")]) == 2
    assert f"{edges}:2: bad url: no scheme" in capsys.readouterr().err
