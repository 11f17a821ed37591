"""Unit tests see rankstream's defaults, whoever runs them."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _no_user_settings(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
                      ) -> None:
    """A developer's ``RANKSTREAM_*`` variables and a ``.env`` in the working
    directory (pydantic-settings reads both) must not change what a unit test sees.
    The integration tests keep them on purpose: they point the suite at the
    services the user runs."""
    for name in list(os.environ):
        if name.upper().startswith("RANKSTREAM_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path_factory.getbasetemp())
