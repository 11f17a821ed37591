"""``rankstream hits``: HITS hubs and authorities for a text query or seed URLs.

    rankstream hits python tutorial             # text query (title + anchor terms)
    rankstream hits --seed https://a.org/ --seed https://b.org/x -k 20 --json

Reads the live graph from Redis (settings: RANKSTREAM_REDIS_URL, RANKSTREAM_KEY_PREFIX);
see docs/hits.md for the procedure, options and cache.
"""

from __future__ import annotations

import argparse
import json
import sys

from consumer.hits_query import (
    DEFAULT_CACHE_TTL,
    MAX_IN,
    MAX_ITER,
    MAX_K,
    MAX_ROOT_SIZE,
    HitsAnswer,
    HitsQuery,
    check_cache_ttl,
    run_hits,
)
from consumer.keys import Keys
from consumer.redis_store import check_layout, connect_redis
from rankstream.errors import InputError
from rankstream.settings import Settings


def add_query_options(parser: argparse.ArgumentParser) -> None:
    """The HITS options shared by ``rankstream hits`` and the benchmark."""
    parser.add_argument("--root-size", type=int, default=200, metavar="N",
                        help=f"root-set cap, 1..{MAX_ROOT_SIZE} (default 200)")
    parser.add_argument("--max-in", type=int, default=50, metavar="N",
                        help=f"in-linking pages added per root page, 0..{MAX_IN} (default 50)")
    parser.add_argument("--keep-intrinsic", action="store_true",
                        help="keep links between pages of the same host (dropped by default)")
    parser.add_argument("--host-weighting", action="store_true",
                        help="Bharat-Henzinger host weights: k links from one host count 1/k")
    parser.add_argument("--normalize", choices=("l2", "sum"), default="l2",
                        help="unit L2 norm (Kleinberg, default) or unit sum (networkx)")
    parser.add_argument("--max-iter", type=int, default=1000, metavar="N",
                        help=f"HITS iterations before it fails, 1..{MAX_ITER} (default 1000)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("terms", nargs="*", metavar="TERM",
                        help="text query: pages whose title or incoming anchor text match")
    parser.add_argument("--seed", action="append", default=[], metavar="URL",
                        help="seed URL for the root set (repeatable; instead of terms)")
    parser.add_argument("-k", type=int, default=10, help=f"results per list, 1..{MAX_K}")
    add_query_options(parser)
    parser.add_argument("--json", action="store_true", help="print the full answer as JSON")
    parser.add_argument("--no-cache", action="store_true",
                        help="neither read nor write the Redis answer cache")
    parser.add_argument("--cache-ttl", type=int, default=DEFAULT_CACHE_TTL, metavar="S",
                        help=f"seconds a cached answer lives (default {DEFAULT_CACHE_TTL})")


def query_from_args(args: argparse.Namespace) -> HitsQuery:
    """Build the :class:`HitsQuery` the parsed arguments describe."""
    text = " ".join(args.terms) if args.terms else None
    if text is None and not args.seed:
        raise InputError("give query terms or at least one --seed URL")
    return HitsQuery(
        text=text,
        seeds=tuple(args.seed),
        k=getattr(args, "k", 10),
        root_size=args.root_size,
        max_in=args.max_in,
        drop_intrinsic=not args.keep_intrinsic,
        host_weighting=args.host_weighting,
        normalize=args.normalize,
        max_iter=args.max_iter,
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    check_cache_ttl(args.cache_ttl)
    query = query_from_args(args)
    client = connect_redis(settings, client_name="rankstream-hits", reader=True)
    try:
        check_layout(client, Keys(settings.key_prefix))
        answer = run_hits(
            client, settings.key_prefix, query,
            cache_ttl=args.cache_ttl, use_cache=not args.no_cache,
        )
    finally:
        client.close()
    if args.json:
        json.dump(answer.to_dict(), sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_answer(answer))
    return 0


def format_answer(answer: HitsAnswer) -> str:
    """The human-readable report: a summary line, then authorities and hubs."""
    what = answer.query.get("terms") or answer.query.get("seeds") or []
    label = "terms" if "terms" in answer.query else "seeds"
    lines = [
        f"HITS for {label}: {' '.join(what)}",
        f"root {answer.root_size} pages, base {answer.base_size} pages, "
        f"{answer.links} links ({answer.intrinsic_dropped} intrinsic dropped); "
        f"{answer.iterations} iterations, error {answer.error:.2g}; "
        f"{answer.timing_ms.get('total', 0.0):.1f} ms"
        f"{' (cached)' if answer.cached else ''}; graph version {answer.graph_version}",
    ]
    if answer.unknown_seeds:
        lines.append(f"not in the graph: {' '.join(answer.unknown_seeds)}")
    if answer.links == 0 and answer.intrinsic_dropped:
        lines.append("every link in the base set is intrinsic (same host): try --keep-intrinsic")
    elif answer.root_size == 0:
        lines.append("no page matches: the root set is empty")
    for title, entries in (("authorities", answer.authorities), ("hubs", answer.hubs)):
        lines.append(f"\n{title}:")
        lines.extend(
            f"{rank:4d}  {page.score:.6f}  {page.url}" for rank, page in enumerate(entries, 1)
        )
    return "\n".join(lines) + "\n"
