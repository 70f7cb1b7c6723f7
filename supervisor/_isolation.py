"""How a task is isolated: systemd.exec(5)'s names (User=, PrivateNetwork=, ...) as one value.

``Isolation`` is to the spawn what ``cgroupfs.Limits`` is to the leaf: a frozen, validated
value in ``TaskSpec.isolation``.  The task's life uses it in exactly two places:

    with spec.isolation.prepare() as options:   # what the spawn needs (e.g. a network
        spawned = spawn(argv, ..., **options)   # namespace), released once the child runs
    Containment(..., isolation=spec.isolation.describe())

An empty ``Isolation()`` means the task runs as the supervisor does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Isolation"]


@dataclass(frozen=True, slots=True)
class Isolation:
    """Isolation settings of one task (none yet: the task runs as the supervisor does)."""

    def is_empty(self) -> bool:
        return True

    @contextlib.contextmanager
    def prepare(self) -> Iterator[dict[str, Any]]:
        """Keyword arguments for ``supervisor._spawn.spawn``, valid inside the block."""
        yield {}

    def describe(self) -> dict[str, Any]:
        """What the task really had, for the result's ``containment``."""
        return {}
