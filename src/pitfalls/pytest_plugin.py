"""pytest plugin (entry point `pytest11`): the `sync_hazards` fixture, to keep a training step free of syncs in CI
(docs/scan.md shows it in use)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pitfalls.hazard_guard import SyncHazardGuard


@pytest.fixture
def sync_hazards() -> Callable[..., SyncHazardGuard]:
    """`sync_hazards(allow=...)` is `pitfalls.no_sync_hazards`: a block that fails the test on a sync hazard."""
    # Imported here, not at the top: every pytest run in an environment with pitfalls loads this plugin, and
    # only the tests that use the fixture should pay for importing torch.
    from pitfalls.hazard_guard import no_sync_hazards

    return no_sync_hazards
