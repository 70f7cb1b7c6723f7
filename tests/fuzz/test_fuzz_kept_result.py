"""Fuzz of how the daemon keeps a result in its row (supervisor/serve/daemontask.py): whatever
the capability lists of a result's isolation hold (names the core gives, in its order or not,
repeated, unknown, not names at all), the result served from what was kept is the result that
was kept, exactly."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from supervisor.lowlevel import capability_names
from supervisor.serve.daemontask import _masks_kept as kept  # (kept_result's last step)
from supervisor.serve.daemontask import served_result

NAMES = list(capability_names((1 << 64) - 1))
names = st.one_of(st.sampled_from(NAMES), st.text(max_size=12), st.integers(), st.none())
in_order = st.lists(st.sampled_from(NAMES), unique=True, max_size=64).map(
    lambda listed: sorted(listed, key=NAMES.index))  # (as the core names a mask)
lists = st.one_of(st.lists(names, max_size=70), in_order, names)
isolations = st.fixed_dictionaries({}, optional={
    "capability_bounding_set": lists, "ambient_capabilities": lists, "capabilities": lists,
    "user": st.text(max_size=5)})


@given(st.one_of(isolations, st.none(), st.integers()), st.sampled_from([None, ["true"]]))
@example({"capabilities": NAMES[:41]}, None)  # a root task's (this kernel: 41 known)
@example({"capabilities": ["CAP_KILL", "CAP_CHOWN"]}, None)  # not the mask's order: kept
@example({"capabilities": ["CAP_CHOWN", "CAP_CHOWN"]}, None)  # repeated: kept
def test_a_result_served_from_what_was_kept_is_the_result(isolation: Any,
                                                         argv: list[str] | None) -> None:
    result: dict[str, Any] = {"outcome": "succeeded", "containment": {"isolation": isolation}}
    if argv is not None:
        result["argv"] = argv
    stored = kept(result)
    assert served_result(stored, "/nonexistent", ["true"]) == result
    if isinstance(isolation, dict) and isolation.get("capabilities") == NAMES[:41]:
        assert stored["containment"]["isolation"]["capabilities"] == {"mask": hex(2**41 - 1)}
