"""corral's supervisor: run commands in their own cgroup v2 leaf, stop them, report honestly.

Example::

    import supervisor, trio

    async def main():
        async with supervisor.open_supervisor() as sup:
            r = await sup.run(["make", "test"], time_limit="10min", grace="5s")
            print(r.outcome, r.exit_code, r.cleanup, r.usage.cpu_total_s)

    trio.run(main)

Note: ``supervisor`` is also the import name of supervisord.  The two cannot be installed in
one environment; corral's distribution is called ``corral``.
"""

from __future__ import annotations

# Not ``from typing import TYPE_CHECKING``: importing typing costs a client verb a few
# milliseconds at every start; type checkers treat any TYPE_CHECKING name as True.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cgroupfs import CpuMax, Limits

    from ._capture import Tap
    from ._errors import (
        ConfigError,
        InternalError,
        PlacementError,
        SpecError,
        SupervisorError,
    )
    from ._handover import HandOver
    from ._isolation import Isolation
    from ._result import (
        Cleanup,
        Containment,
        KillSnapshot,
        Outcome,
        ProcessInfo,
        StopReason,
        StopRecord,
        StreamOutput,
        TaskResult,
        Usage,
    )
    from ._spec import TaskSpec
    from ._supervisor import Batch, Supervisor, open_supervisor
    from ._task import HandedOver, TaskHandle

# Public name -> the module that defines it.  Loaded on first use (PEP 562), so that
# ``import supervisor`` (and the CLI's client verbs, which live below it) cost no trio import.
_WHERE = {
    "CpuMax": "cgroupfs", "Limits": "cgroupfs",
    "ConfigError": "._errors", "InternalError": "._errors", "PlacementError": "._errors",
    "SpecError": "._errors", "SupervisorError": "._errors",
    "Cleanup": "._result", "Containment": "._result", "KillSnapshot": "._result",
    "Outcome": "._result",
    "ProcessInfo": "._result", "StopReason": "._result", "StopRecord": "._result",
    "StreamOutput": "._result", "TaskResult": "._result", "Usage": "._result",
    "TaskSpec": "._spec",
    "Isolation": "._isolation",
    "Batch": "._supervisor", "Supervisor": "._supervisor", "open_supervisor": "._supervisor",
    "TaskHandle": "._task",
    "HandedOver": "._task",
    "HandOver": "._handover",
    "Tap": "._capture",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'supervisor' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = [
    "Batch",
    "Cleanup",
    "ConfigError",
    "Containment",
    "CpuMax",
    "HandOver",
    "HandedOver",
    "InternalError",
    "Isolation",
    "KillSnapshot",
    "Limits",
    "Outcome",
    "PlacementError",
    "ProcessInfo",
    "SpecError",
    "StopReason",
    "StopRecord",
    "StreamOutput",
    "Supervisor",
    "SupervisorError",
    "Tap",
    "TaskHandle",
    "TaskResult",
    "TaskSpec",
    "Usage",
    "open_supervisor",
]
