"""Soak runs: marker ``soak``, collected always, run only when asked.

The soak holds the pipeline at its target rate for 10 minutes, so it is not part
of the default suite (CI): it is skipped unless ``RANKSTREAM_SOAK_SECONDS`` is set
(``600`` for the real run; ``60`` checks that it works). See docs/reliability.md.
"""

from __future__ import annotations

import pytest

from rankstream.settings import Settings


@pytest.fixture(autouse=True)
def _services_running(services: Settings) -> None:
    """Bring the shared services up (once per session) before a soak run."""
