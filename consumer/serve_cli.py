"""``rankstream serve``: run the HTTP query API (FastAPI) on uvicorn.

    rankstream serve [--host 127.0.0.1] [--port 8080]

Serves ``GET /hits``, ``/top``, ``/score``, ``/status`` and ``/metrics`` over the
graph and scores in Redis (settings: RANKSTREAM_REDIS_URL, RANKSTREAM_KEY_PREFIX);
the OpenAPI schema is at ``/openapi.json``. Stops on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import socket

from consumer.hits_query import DEFAULT_CACHE_TTL, check_cache_ttl
from rankstream.errors import InputError, ServiceError
from rankstream.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: loopback only)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    parser.add_argument("--cache-ttl", type=int, default=DEFAULT_CACHE_TTL, metavar="S",
                        help=f"seconds a cached HITS answer lives (default {DEFAULT_CACHE_TTL})")
    parser.add_argument("--log-level", default="info", type=str.lower,  # either case
                        choices=("critical", "error", "warning", "info", "debug"))


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound here rather than by uvicorn.

    uvicorn reports a bind failure with log lines and ``sys.exit(3)``; binding first
    turns "address in use" or an unknown host into our one-line error, exit 2.
    """
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        return socket.create_server(address, family=family)
    except (OSError, UnicodeError) as exc:  # unknown host, address in use, denied; a
        # name IDNA cannot encode (an empty or 64-character label) is a UnicodeError
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ServiceError(f"cannot serve on {host}:{port}: {reason}") from exc


def run(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here so `rankstream --help` and other commands never load the web stack.
    import uvicorn

    from consumer.http_api import create_app, server_config
    from consumer.keys import Keys
    from consumer.redis_store import check_layout, connect_redis, redis_errors

    if not 0 < args.port < 65536:
        raise InputError(f"--port must be in 1..65535, got {args.port}")
    check_cache_ttl(args.cache_ttl)
    client = connect_redis(settings, client_name="rankstream-serve", reader=True)
    try:
        with redis_errors("connecting"):
            client.ping()
        check_layout(client, Keys(settings.key_prefix))  # a newer layout, not misread
        app = create_app(client, settings.key_prefix, cache_ttl=args.cache_ttl)
        config = server_config(app, host=args.host, port=args.port, log_level=args.log_level)
        with _bind(args.host, args.port) as listener:
            # uvicorn announces the address only for sockets it bound itself.
            host = f"[{args.host}]" if ":" in args.host else args.host
            logging.getLogger("uvicorn.error").info(
                "serving on http://%s:%d (Ctrl-C stops)", host, listener.getsockname()[1])
            uvicorn.Server(config).run(sockets=[listener])
    finally:
        client.close()
    return 0
