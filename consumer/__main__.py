"""``python -m consumer COMMAND ...``: the consumer's subcommands without the console script.

Same parser, settings and error handling as ``rankstream COMMAND`` (it is
:func:`rankstream.cli.main`, whose ``COMMANDS`` table registers every command), so
tests and process supervisors can start the consumer as ``python -m consumer consume``.
"""

from __future__ import annotations

from rankstream.cli import main

raise SystemExit(main())
