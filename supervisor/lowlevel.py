"""What corral's own command line and daemon use of the core beyond the library's API: public,
so that they (and any program built on corral the same way) need none of its private modules.
Each name is loaded when first used (``corral ps`` must not pay for the spawn helper).

- :func:`spawn`, :class:`SpawnError`: the native spawn into a cgroup leaf (clone3 with
  CLONE_INTO_CGROUP and a pidfd), errors by the step that failed (``corral check`` probes with
  it).
- :func:`signalfd`: a signalfd for ``signals`` (they must be blocked first), read by
  ``corral run`` to tell a key from a ``kill``.
- :func:`has_cap`: whether this process holds a capability (``"CAP_SYS_ADMIN"``).
- :func:`open_output`: open a file corral writes (a JSON record, a plot, a log) without
  following a symbolic link planted in its place.
- :func:`first_leaf`: the first exception that is not a group, inside an exception group.
- :func:`capability_names`: the names of the capabilities in a mask, lowest number first, as a
  result names them.
- :data:`WALK_FDS`: the most pidfds a signal's walk of a tree in steps holds at once (the
  daemon bounds how many walks run together by it).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._errors import first_leaf
    from ._isohost import has_cap
    from ._isovalues import capability_names
    from ._outfile import open_output
    from ._spawn import SpawnError, signalfd, spawn
    from ._stop import WALK_FDS

_WHERE = {"spawn": "._spawn", "SpawnError": "._spawn", "signalfd": "._spawn",
          "has_cap": "._isohost", "open_output": "._outfile", "first_leaf": "._errors",
          "capability_names": "._isovalues", "WALK_FDS": "._stop"}

__all__ = ["WALK_FDS", "SpawnError", "capability_names", "first_leaf", "has_cap", "open_output",
           "signalfd", "spawn"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'supervisor.lowlevel' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, "supervisor"), name)
    globals()[name] = value
    return value
