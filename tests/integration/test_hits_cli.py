"""``rankstream hits`` and ``rankstream serve`` argument handling, against the real Redis."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import pytest

from consumer import hits_cli, serve_cli
from rankstream.errors import InputError
from rankstream.settings import Settings
from tests.integration.conftest import HandGraph


def _run(argv: list[str], settings: Settings) -> int:
    parser = argparse.ArgumentParser()
    hits_cli.add_arguments(parser)
    return hits_cli.run(parser.parse_args(argv), settings)


@pytest.fixture
def settings(graph: HandGraph, services: Settings) -> Iterator[Settings]:
    graph.write(
        [("https://a.org/", "https://b.net/"), ("https://c.com/", "https://b.net/"),
         ("https://a.org/", "https://d.io/ü ö")],
        titles={"https://b.net/": "Snake handbook", "https://d.io/ü ö": "Snake oil"},
        pages=["https://lonely.org/"],
    )
    yield services.model_copy(update={"key_prefix": graph.prefix})


def test_hits_text_query_prints_a_table(settings: Settings, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    assert _run(["snake", "handbook", "-k", "2"], settings) == 0
    out = capsys.readouterr().out
    assert out.startswith("HITS for terms: handbook snake\n")
    assert "root 2 pages, base 4 pages, 3 links (0 intrinsic dropped)" in out
    assert "   1  " in out and "https://b.net/" in out.split("hubs:")[0]


def test_hits_seed_query_as_json(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--seed", "https://B.net", "--seed", "https://nowhere.org/", "--json",
                 "--host-weighting", "--normalize", "sum"], settings) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["query"]["seeds"] == ["https://b.net/", "https://nowhere.org/"]
    assert answer["unknown_seeds"] == ["https://nowhere.org/"]
    assert answer["authorities"][0] == {"url": "https://b.net/", "score": 1.0}
    assert [h["url"] for h in answer["hubs"]] == ["https://a.org/", "https://c.com/"]


def test_hits_reports_an_isolated_root(settings: Settings, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    assert _run(["--seed", "https://lonely.org/"], settings) == 0
    assert "base 1 pages, 0 links" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "query terms or at least one --seed"),
        (["x", "--seed", "https://a.org/"], "not both"),
        (["--seed", "a.org"], "bad seed URL"),
        (["x", "-k", "0"], "k: must be an integer in [1, 1000]"),
        (["x", "--root-size", "5000"], "root_size"),
        (["x", "--max-in", "-1"], "max_in"),
        (["x", "--max-iter", "0"], "max_iter"),
        (["x", "--cache-ttl", "0"], "--cache-ttl"),
        (["of the"], "no searchable terms"),
    ],
)
def test_hits_bad_arguments_are_input_errors(
    settings: Settings, argv: list[str], message: str
) -> None:
    with pytest.raises(InputError) as caught:
        _run(argv, settings)
    assert message in str(caught.value)


def test_serve_rejects_a_bad_port_before_starting(settings: Settings) -> None:
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    with pytest.raises(InputError, match="--port"):
        serve_cli.run(parser.parse_args(["--port", "70000"]), settings)


def test_through_the_cli_dispatcher(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The module plugs into rankstream.cli as the COMMANDS line in docs/hits.md says."""
    from rankstream import cli

    monkeypatch.setitem(cli.COMMANDS, "hits", ("consumer.hits_cli", "HITS"))
    monkeypatch.setenv("RANKSTREAM_KEY_PREFIX", settings.key_prefix)
    monkeypatch.setenv("RANKSTREAM_REDIS_URL", settings.redis_url)
    assert cli.main(["hits", "snake", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["root_size"] == 2
    assert cli.main(["hits", "-k", "0", "snake"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rankstream hits: error: k: must be")
