"""Tests that need another machine than this one (AMX, AVX2 only, no runtime packages) pretend
to be it: `machine()` answers `fake` inside the block. (The suite as a whole runs as an AVX2-only
CPU through `BERTHEADS_CPU_FLAGS`, set in conftest.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from bertheads.base import machine as machine_module
from bertheads.base.machine import Machine


@contextmanager
def pretend(fake: Machine) -> Iterator[Machine]:
    """`machine()` is `fake` inside the block (its detection replaced; blocks nest)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(machine_module, "detected", lambda packages: fake)
        yield fake
