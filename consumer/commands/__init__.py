"""The consumer's subcommands: ``consume``, ``top``, ``score``, ``status`` and ``rekey``.

Each module exposes ``add_arguments(parser)`` and ``run(args, settings) -> int``
and is registered by one line in ``COMMANDS`` of :mod:`rankstream.cli`, the one
table of every ``rankstream`` command (``python -m consumer`` uses it too).
"""
