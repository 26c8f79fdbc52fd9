"""Test tiers: every test that starts processes (``distributed``) is ``slow`` too, so that
``pytest -m "not slow"`` runs every module's logic in a couple of minutes (README:
Development)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("distributed") is not None:
            item.add_marker(pytest.mark.slow)
