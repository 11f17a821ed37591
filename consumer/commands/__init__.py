"""The consumer's subcommands: ``consume``, ``top``, ``score`` and ``status``.

Each module exposes ``add_arguments(parser)`` and ``run(args, settings) -> int``
and is registered by one line in ``COMMANDS`` of :mod:`rankstream.cli`.
"""
