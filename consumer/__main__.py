"""``python -m consumer COMMAND ...``: the consumer's subcommands without the console script.

Same parser, settings and error handling as ``rankstream COMMAND`` (it is
:func:`rankstream.cli.main` with this package's commands registered), so tests
and process supervisors can start the consumer as ``python -m consumer consume``.
"""

from __future__ import annotations

from consumer.commands import COMMAND_TABLE
from rankstream.cli import COMMANDS, main

for _name, _entry in COMMAND_TABLE.items():
    COMMANDS.setdefault(_name, _entry)

raise SystemExit(main())
