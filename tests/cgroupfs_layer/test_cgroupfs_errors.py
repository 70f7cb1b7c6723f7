"""The error hierarchy: classes, messages, errno mapping."""

from __future__ import annotations

import errno
import pickle

import pytest

from cgroupfs import (
    CgroupBusy,
    CgroupError,
    CgroupNotFound,
    CgroupOSError,
    ControllerUnavailable,
    InvalidLimit,
    InvalidName,
    NoCgroup2Error,
)
from cgroupfs._errors import os_error


def test_hierarchy() -> None:
    assert issubclass(CgroupOSError, CgroupError) and issubclass(CgroupOSError, OSError)
    assert issubclass(CgroupBusy, CgroupOSError) and issubclass(CgroupNotFound, CgroupOSError)
    for plain in (NoCgroup2Error, ControllerUnavailable):
        assert issubclass(plain, CgroupError) and not issubclass(plain, (OSError, ValueError))
    for bad_value in (InvalidLimit, InvalidName):
        assert issubclass(bad_value, CgroupError) and issubclass(bad_value, ValueError)


def test_os_error_message_leads_with_the_action_and_keeps_errno_and_path() -> None:
    exc = os_error(
        OSError(errno.EBUSY, "Device or resource busy"),
        action="writing 'max' to",
        path="/sys/fs/cgroup/x/memory.max",
    )
    assert type(exc) is CgroupBusy
    assert str(exc) == (
        "writing 'max' to /sys/fs/cgroup/x/memory.max: [Errno 16] Device or resource busy"
    )
    assert (exc.errno, exc.strerror, exc.filename) == (
        errno.EBUSY,
        "Device or resource busy",
        "/sys/fs/cgroup/x/memory.max",
    )


@pytest.mark.parametrize(
    ("code", "cls"),
    [(errno.EBUSY, CgroupBusy), (errno.ENOENT, CgroupNotFound), (errno.EINVAL, CgroupOSError)],
)
def test_os_error_picks_the_class_by_errno(code: int, cls: type[CgroupOSError]) -> None:
    exc = os_error(OSError(code, "x"), action="reading", path="/p")
    assert type(exc) is cls


def test_a_hint_is_appended_and_survives_pickling() -> None:
    exc = CgroupBusy(errno.EBUSY, "Device or resource busy", "/p/cgroup.procs", "writing '1' to")
    hinted = exc.with_hint("move it to a leaf")
    assert type(hinted) is CgroupBusy
    assert str(hinted).endswith("Device or resource busy; move it to a leaf")
    again = pickle.loads(pickle.dumps(hinted))
    assert type(again) is CgroupBusy and str(again) == str(hinted)


def test_controller_unavailable_names_controller_path_offer_and_fix() -> None:
    exc = ControllerUnavailable(
        ["memory"], "/sys/fs/cgroup/unified", {"hugetlb"}, fix="boot with X"
    )
    assert str(exc) == (
        "controller 'memory' is not available under /sys/fs/cgroup/unified "
        "(cgroup.controllers: hugetlb); boot with X"
    )
    assert (exc.controller, exc.path, exc.available) == (
        "memory",
        "/sys/fs/cgroup/unified",
        frozenset({"hugetlb"}),
    )
