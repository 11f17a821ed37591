"""`rankstream rekey`: the graph under a new prefix with dense ids, against real Redis
and Kafka. The oracle is the old prefix itself (the same URL graph, index answers and
published scores) and, once the consumer carries on under the new prefix, the event
log (the same offline graph as if nothing had been copied)."""

from __future__ import annotations

import os
from typing import Any

import pytest

import consumer.rekey as rekey_module
from consumer.hits_query import HitsQuery, run_hits
from consumer.keys import ALGORITHMS, Keys
from consumer.lock import ConsumerLock, LockHeld
from consumer.rekey import rekey
from producer.schema import make_event
from rankstream.errors import ConfigError, ServiceError
from rankstream.services.testing import delete_keys, redis_client
from rankstream.settings import Settings
from tests.faults.harness import exact_scores, index_problems, stored_graph
from tests.integration.test_consumer_pipeline import (
    consume,
    graph_as_urls,
    l1,
    offline_graph,
    publish,
    published,
)
from tests.text_index_model import model_of, stored_sources

SITE = "https://site.example"


def _crawls(rounds: int, start_ts: int) -> list[dict[str, Any]]:
    """20 pages re-crawled ``rounds`` times; each crawl links 3 site pages and 2
    external URLs new to that crawl (with anchor text), which the orphan rule removes
    at the next crawl: the ids that only grow."""
    events = []
    for r in range(rounds):
        for p in range(20):
            links: list[Any] = [f"{SITE}/{(p + k) % 20}" for k in (1, 2, 5)]
            links += [{"url": f"https://ads{r}.example/{p}/{x}", "text": f"banner {x}"}
                      for x in range(2)]
            events.append({"type": "page", "url": f"{SITE}/{p}", "links": links,
                           "title": f"page {p}", "ts": start_ts + r * 100 + p})
    return events


def _index(client: Any, prefix: str, kept: set[bytes] | None = None) -> dict[bytes, set[bytes]]:
    """The text index as term -> URLs (of ``kept`` URLs only, if given)."""
    urls = client.hgetall(f"{prefix}page:url")
    head = f"{prefix}term:".encode()
    index = {}
    for key in client.scan_iter(match=f"{prefix}term:*", count=1000):
        found = {urls[member] for member in client.smembers(key)}
        found = found if kept is None else found & kept
        if found:
            index[key[len(head):]] = found
    return index


def _answers(client: Any, prefix: str) -> dict[str, Any]:
    answer = run_hits(client, prefix, HitsQuery(text="page banner"), use_cache=False)
    return {key: value for key, value in answer.to_dict().items()
            if key not in ("cached", "timing_ms")}


def test_rekey_keeps_the_graph_and_drops_only_the_forgotten_ids(
        one_partition: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = one_partition
    # Chunks of a few keys and commands, so that the copy crosses every chunk boundary
    # (each full-size chunk is the same code).
    for name in ("WRITE_CHUNK", "READ_CHUNK", "SETS_PER_PAYLOAD"):
        monkeypatch.setattr(rekey_module, name, 3)
    # Beside the old prefix, not under it: deleting the old keys must not touch these.
    new = settings.model_copy(update={"key_prefix": settings.key_prefix[:-1] + "-v2:"})
    client = redis_client(settings)
    try:
        log = _crawls(4, 1_000)
        # A crawled page removed with a ts (its tombstone is kept) and one with a title
        # removed without one (its title is kept).
        log += [{"type": "page_removed", "url": f"{SITE}/5", "ts": 5_000},
                {"type": "page", "url": f"{SITE}/6x", "links": [], "title": "lonely"},
                {"type": "page_removed", "url": f"{SITE}/6x"}]
        publish(settings, log)
        consume(settings)
        with pytest.raises(ConfigError, match="must not be one the start of the other"):
            rekey(client, settings.key_prefix, settings.key_prefix + "v2:", settings.topic)
        report = rekey(client, settings.key_prefix, new.key_prefix, settings.topic)

        old_keys, new_keys = Keys(settings.key_prefix), Keys(new.key_prefix)
        assert stored_graph(client, new) == stored_graph(client, settings)
        assert index_problems(client, new) == []
        kept = set(client.hkeys(Keys(new.key_prefix).page_id))
        assert _index(client, new.key_prefix) == _index(client, settings.key_prefix, kept)
        assert _answers(client, new.key_prefix) == _answers(client, settings.key_prefix)
        # With its counts: the forgotten ads lost their in-links, and their anchors.
        sources = model_of([make_event(event) for event in log])
        assert stored_sources(client, new.key_prefix) == sources
        assert stored_sources(client, settings.key_prefix) == sources
        for algorithm in ALGORITHMS:
            assert published(client, new.key_prefix, algorithm) == \
                published(client, settings.key_prefix, algorithm)
        old_graph, new_graph = (client.hgetall(k.graph) for k in (old_keys, new_keys))
        assert {k: v for k, v in new_graph.items() if k != b"ids"} == \
            {k: v for k, v in old_graph.items() if k != b"ids"}
        # Kept: 20 site pages (the removed one too, for its ts), the 2 ads of the last
        # crawl of each but the removed page (its went with it), and the titled page.
        # Forgotten: the ads of the earlier crawls, and those of the removed page.
        assert (report.ids_before, report.ids_after) == (20 + 8 * 20 + 1, 20 + 2 * 19 + 1)
        assert int(new_graph[b"ids"]) == report.ids_after
        assert client.hget(new_keys.page_ts, client.hget(new_keys.page_id, f"{SITE}/5")) \
            == b"5000"
        assert client.hget(new_keys.page_title,
                           client.hget(new_keys.page_id, f"{SITE}/6x")) == b"lonely"

        # The consumer carries on under the new prefix from the same offsets: a stale
        # crawl of the removed page is still ignored, a forgotten URL comes back with a
        # new id, and the result is the log's graph.
        more = [{"type": "page", "url": f"{SITE}/5", "links": [f"{SITE}/1"], "ts": 4_000},
                {"type": "link_added", "src": f"{SITE}/1", "dst": "https://ads0.example/1/0"},
                *_crawls(1, 9_000)]
        publish(settings, more)
        service = consume(new)
        assert service.stats.events == len(more)
        assert int(client.hget(new_keys.graph, "stale_ignored")) == 1
        final = offline_graph(log + more)
        assert stored_graph(client, new) == graph_as_urls(final)
        assert index_problems(client, new) == []
        assert stored_sources(client, new.key_prefix) == model_of(
            [make_event(event) for event in log + more])
        for algorithm in ALGORITHMS:  # the scores too, within their published bound
            exact = exact_scores(final, algorithm, settings.damping)
            bound = float(client.hget(new_keys.meta(algorithm), "bound"))
            assert l1(published(client, new.key_prefix, algorithm), exact) <= bound + 1e-9
    finally:
        client.close()
        delete_keys(settings, new.key_prefix)


def test_rekey_refuses_a_running_consumer_and_a_prefix_in_use(graph: Any) -> None:
    """`graph`: a hand-written graph under a fresh prefix (Redis only)."""
    client, prefix = graph.client, graph.prefix
    target = prefix[:-1] + "-x:"
    graph.write([("https://a.example/", "https://b.example/")])
    # Held by another live process (our parent): this one's own pid would be taken back.
    lease = ConsumerLock(client, Keys(prefix).lock, pid=os.getppid())
    lease.acquire()
    try:
        with pytest.raises(LockHeld):
            rekey(client, prefix, target, "t")
    finally:
        lease.release()
    client.set(target + "stray", "1")
    try:
        with pytest.raises(ConfigError, match="already holds data"):
            rekey(client, prefix, target, "t")
        assert client.get(Keys(target).lock) is None  # both leases let go
        assert client.get(Keys(prefix).lock) is None
    finally:
        client.delete(target + "stray")


def test_a_copy_cut_short_is_refused_by_consumers_and_readers(one_partition: Settings,
                                                              monkeypatch: Any) -> None:
    """P graph is marked unfinished by the copy's first write: a consumer started on a
    half-copied prefix re-read the topic from offset 0 (no P offsets yet), a review
    found. The old prefix moving during the copy is refused too."""
    from consumer.options import ConsumeOptions
    from consumer.redis_store import check_layout
    from consumer.service import ConsumerService

    settings = one_partition
    new = settings.model_copy(update={"key_prefix": settings.key_prefix[:-1] + "-cut:"})
    client = redis_client(settings)
    try:
        with pytest.raises(ConfigError, match="nothing to copy: no graph under"):
            rekey(client, settings.key_prefix, new.key_prefix, settings.topic)
        assert not list(client.scan_iter(match=f"{new.key_prefix}*"))
        publish(settings, _crawls(1, 1_000))
        consume(settings)

        def cut_short(*_args: Any) -> int:
            raise RuntimeError("killed mid-copy")

        monkeypatch.setattr(rekey_module, "_copy_terms", cut_short)
        with pytest.raises(RuntimeError, match="killed mid-copy"):
            rekey(client, settings.key_prefix, new.key_prefix, settings.topic)
        with pytest.raises(ConfigError, match="unfinished `rankstream rekey`"):
            check_layout(client, Keys(new.key_prefix))
        with pytest.raises(ConfigError, match="unfinished"):
            ConsumerService(new, ConsumeOptions(until_caught_up=True)).run()
        assert client.hlen(Keys(new.key_prefix).offsets) == 0  # nothing to resume from
        # `status` (and --prometheus) printed the copy's counters (session 37's review)
        from rankstream.cli import main
        from tests.faults.stack import settings_env

        for name, value in settings_env(new).items():
            monkeypatch.setenv(name, value)
        for argv in (["status"], ["status", "--prometheus"], ["status", "--check"]):
            assert main(argv) == 2, argv
        delete_keys(settings, new.key_prefix)

        def moved(client_: Any, old: Keys, *_args: Any) -> int:
            client_.hincrby(old.graph, "version", 1)  # a consumer that ignored the lease
            return 0

        monkeypatch.setattr(rekey_module, "_copy_terms", moved)
        with pytest.raises(ServiceError, match="changed during the copy"):
            rekey(client, settings.key_prefix, new.key_prefix, settings.topic)
        with pytest.raises(ConfigError, match="unfinished"):
            check_layout(client, Keys(new.key_prefix))
    finally:
        client.close()
        delete_keys(settings, new.key_prefix)


def test_the_rekey_command_says_what_it_kept_and_what_to_do_next(
        graph: Any, services: Settings, monkeypatch: Any, capsys: Any) -> None:
    from rankstream.cli import main
    from tests.faults.stack import settings_env

    graph.write([("https://a.example/", "https://b.example/")])
    target = graph.prefix[:-1] + "-cli:"
    env = settings_env(services.model_copy(update={"key_prefix": graph.prefix}))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        assert main(["rekey", target]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"copied {graph.prefix!r} to {target!r}: 2 page ids -> 2 ")
        assert f"RANKSTREAM_KEY_PREFIX={target}" in out
        assert main(["rekey", target]) == 2  # the new prefix is in use now
        assert "already holds data" in capsys.readouterr().err
    finally:
        delete_keys(services, target)
