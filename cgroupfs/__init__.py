"""cgroupfs: a synchronous, typed layer over the cgroup v2 filesystem.

It finds the cgroup2 mount and a process's cgroup, makes and removes cgroups,
enables controllers, writes limits, reads stats and events, freezes and kills.
It knows nothing about tasks, policy or trio: the supervisor builds on it.

    from cgroupfs import Cgroup, Limits, own_cgroup

    with Cgroup.open(own_cgroup()) as here:
        leaf = here.make_child("job-1")
        ...

Every interface file is read and written with unbuffered ``os.read`` /
``os.write`` relative to the cgroup's directory fd, and every kernel refusal
comes out as a ``CgroupOSError`` carrying errno and the exact file path.
"""

from ._cgroup import Cgroup, Destroyed
from ._errors import (
    CgroupBusy,
    CgroupError,
    CgroupNotFound,
    CgroupOSError,
    ControllerUnavailable,
    InvalidLimit,
    InvalidName,
    NoCgroup2Error,
)
from ._kill import KILL_METHODS
from ._limits import CpuMax, Limits
from ._mount import (
    MountInfo,
    cgroup_fs_path,
    find_cgroup2_mount,
    hierarchy_mode,
    is_writable,
    own_cgroup,
    parse_mountinfo,
    parse_proc_cgroup,
)
from ._stats import (
    CgroupEvents,
    CgroupStat,
    CgroupStats,
    CpuStat,
    MemoryEvents,
    PidsEvents,
    parse_events,
    parse_flat_keyed,
)

__all__ = [
    "KILL_METHODS",
    "Cgroup",
    "CgroupBusy",
    "CgroupError",
    "CgroupEvents",
    "CgroupNotFound",
    "CgroupOSError",
    "CgroupStat",
    "CgroupStats",
    "ControllerUnavailable",
    "CpuMax",
    "CpuStat",
    "Destroyed",
    "InvalidLimit",
    "InvalidName",
    "Limits",
    "MemoryEvents",
    "MountInfo",
    "NoCgroup2Error",
    "PidsEvents",
    "cgroup_fs_path",
    "find_cgroup2_mount",
    "hierarchy_mode",
    "is_writable",
    "own_cgroup",
    "parse_events",
    "parse_flat_keyed",
    "parse_mountinfo",
    "parse_proc_cgroup",
]
