"""The consumer's subcommands: ``consume``, ``top``, ``score`` and ``status``.

Each module exposes ``add_arguments(parser)`` and ``run(args, settings) -> int``
and is registered by one line in ``COMMANDS`` of :mod:`rankstream.cli`
(:data:`COMMAND_TABLE` holds exactly those lines).
"""

COMMAND_TABLE: dict[str, tuple[str, str]] = {
    "consume": ("consumer.commands.consume",
                "run the streaming consumer: Kafka events -> Redis graph and live scores"),
    "top": ("consumer.commands.top", "print the live top-k pages from Redis"),
    "score": ("consumer.commands.score", "print one URL's live scores from Redis"),
    "status": ("consumer.commands.status", "print consumer health, counters and freshness"),
}
