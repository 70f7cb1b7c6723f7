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

from cgroupfs import CpuMax, Limits

from ._errors import ConfigError, InternalError, PlacementError, SpecError, SupervisorError
from ._result import (
    Cleanup,
    Containment,
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
from ._task import TaskHandle

__all__ = [
    "Batch",
    "Cleanup",
    "ConfigError",
    "Containment",
    "CpuMax",
    "InternalError",
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
    "TaskHandle",
    "TaskResult",
    "TaskSpec",
    "Usage",
    "open_supervisor",
]
