"""``rankstream serve``: run the HTTP query API (FastAPI) on uvicorn.

    rankstream serve [--host 127.0.0.1] [--port 8080]

Serves ``GET /hits``, ``/top``, ``/score`` and ``/status`` over the graph and scores
in Redis (settings: RANKSTREAM_REDIS_URL, RANKSTREAM_KEY_PREFIX); the OpenAPI
schema is at ``/openapi.json``. Stops on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse

from consumer.hits_query import DEFAULT_CACHE_TTL
from rankstream.errors import InputError, ServiceError
from rankstream.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: loopback only)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    parser.add_argument("--cache-ttl", type=int, default=DEFAULT_CACHE_TTL, metavar="S",
                        help=f"seconds a cached HITS answer lives (default {DEFAULT_CACHE_TTL})")
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"))


def run(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here so `rankstream --help` and other commands never load the web stack.
    import uvicorn

    from consumer.http_api import create_app, server_config
    from consumer.redis_store import connect_redis, redis_errors

    if not 0 < args.port < 65536:
        raise InputError(f"--port must be in 1..65535, got {args.port}")
    if args.cache_ttl < 1:
        raise InputError("--cache-ttl must be at least 1 second")
    client = connect_redis(settings, client_name="rankstream-serve")
    with redis_errors("connecting"):
        client.ping()
    app = create_app(client, settings.key_prefix, cache_ttl=args.cache_ttl)
    try:
        config = server_config(app, host=args.host, port=args.port, log_level=args.log_level)
        uvicorn.Server(config).run()
    except OSError as exc:  # address in use, permission denied
        raise ServiceError(f"cannot serve on {args.host}:{args.port}: {exc}") from exc
    finally:
        client.close()
    return 0
