"""``record``: each class it makes behaves as the frozen, slotted dataclass of the same body.

The shared ``__repr__``, ``__eq__`` and ``__hash__`` are checked against what
``dataclasses.dataclass(frozen=True, slots=True)`` generates for the same class, on the
same values: the fields in order, ``compare=False``, ``repr=False`` and ``hash=False``
honoured, another class never equal; and every public record of both packages is one.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from typing import Any

import pytest

import cgroupfs
import supervisor
from cgroupfs._record import record


def body() -> type:
    class Point:
        """A point."""

        x: int
        y: str = "a"
        tags: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)
        extra: Any = dataclasses.field(default=None, hash=False)

        @property
        def twice(self) -> int:
            return 2 * self.x

    return Point


Ours = record(body())
Theirs = dataclasses.dataclass(frozen=True, slots=True)(body())
VALUES: list[dict[str, Any]] = [
    {"x": 1}, {"x": 1, "y": "b"}, {"x": 1, "tags": ("t",)}, {"x": 2, "extra": [1]},
    {"x": 1, "y": "it's \"quoted\"\n"}, {"x": -1, "extra": None},
]


@pytest.mark.parametrize("a", VALUES)
@pytest.mark.parametrize("b", VALUES)
def test_equality_and_hash_are_the_dataclasses(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert (Ours(**a) == Ours(**b)) == (Theirs(**a) == Theirs(**b))
    assert (Ours(**a) != Ours(**b)) == (Theirs(**a) != Theirs(**b))
    if not isinstance(a.get("extra"), list):  # (an unhashable value in a compared field)
        assert hash(Ours(**a)) == hash(Theirs(**a))


@pytest.mark.parametrize("a", VALUES)
def test_repr_is_the_dataclasses(a: dict[str, Any]) -> None:
    assert repr(Ours(**a)) == repr(Theirs(**a)).replace("Theirs", "Ours")


def test_it_is_the_same_dataclass_in_everything_else() -> None:
    p = Ours(1, "b", ("t",))
    assert [f.name for f in dataclasses.fields(Ours)] == ["x", "y", "tags", "extra"]
    assert Ours.__match_args__ == Theirs.__match_args__
    assert Ours.__slots__ == Theirs.__slots__ and not hasattr(p, "__dict__")
    assert str(inspect.signature(Ours)) == str(inspect.signature(Theirs))
    assert Ours.__doc__ == "A point." and p.twice == 2
    assert dataclasses.replace(p, x=5) == Ours(5, "b", ("t",))
    assert dataclasses.asdict(p) == {"x": 1, "y": "b", "tags": ("t",), "extra": None}
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.y  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.other = 1  # type: ignore[attr-defined]
    assert Ours(1) != Theirs(1) and Ours(1).__eq__(1) is NotImplemented
    events = cgroupfs.CgroupEvents(populated=True, frozen=False)  # (pickled by its name)
    assert pickle.loads(pickle.dumps(events)) == events
    assert copy.copy(p) == p and copy.deepcopy(p) == p and copy.copy(p) is not p


def test_init_is_the_dataclasses_defaults_factories_unset_and_post_init() -> None:
    def new_parts() -> list[str]:
        return []

    def body2() -> type:
        class Job:
            name: str
            parts: list[str] = dataclasses.field(default_factory=new_parts)
            size: int = 3
            seen: int = dataclasses.field(default=0, init=False)
            later: list[str] = dataclasses.field(default_factory=new_parts, init=False)
            unset: int = dataclasses.field(init=False)

            def __post_init__(self) -> None:
                object.__setattr__(self, "seen", self.size * 2)

        return Job

    ours, theirs = record(body2()), dataclasses.dataclass(frozen=True, slots=True)(body2())
    for args, kwargs in [(("a",), {}), (("a", ["p"], 5), {}), (("a",), {"size": 1}),
                         ((), {"name": "b", "parts": ["q"]})]:
        o, t = ours(*args, **kwargs), theirs(*args, **kwargs)
        assert [getattr(o, n) for n in ("name", "parts", "size", "seen", "later")] == \
               [getattr(t, n) for n in ("name", "parts", "size", "seen", "later")]
        assert not hasattr(o, "unset") and not hasattr(t, "unset")
    assert ours("a").parts is not ours("a").parts  # (a new list each time)
    assert str(inspect.signature(ours)) == str(inspect.signature(theirs))
    for bad in [(), ("a", [], 1, 2)]:
        with pytest.raises(TypeError):
            ours(*bad)
    with pytest.raises(TypeError):
        ours("a", seen=1)


def test_what_a_record_cannot_be_is_refused_when_it_is_made() -> None:
    class Late:
        x: int = 1
        y: str

    with pytest.raises(TypeError):
        record(Late)

    class Writes:
        x: int

        def __setattr__(self, name: str, value: Any) -> None:
            pass

    with pytest.raises(TypeError, match="__setattr__"):
        record(Writes)


def test_its_type_hints_read_its_module_and_it_may_be_a_frozen_dataclass_base() -> None:
    import typing

    hints = typing.get_type_hints(cgroupfs.Limits.__init__)
    assert hints["return"] is type(None) and "cpu_max" in hints
    params = cgroupfs.Limits.__dataclass_params__  # type: ignore[attr-defined]
    assert (params.init, params.repr, params.eq, params.frozen) == (True, True, True, True)

    @dataclasses.dataclass(frozen=True)
    class Named(Ours):  # type: ignore[valid-type,misc]
        name: str = "n"

    n = Named(1, name="m")
    assert (n.x, n.name) == (1, "m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        n.name = "o"


def test_a_method_the_class_wrote_itself_is_kept() -> None:
    @record
    class Shown:
        x: int

        def __repr__(self) -> str:
            return "shown"

    assert repr(Shown(1)) == "shown" and Shown(1) == Shown(1)


def test_a_record_that_wrote_eq_alone_is_hashable_as_a_dataclass_is() -> None:
    @record
    class Loose:
        x: int

        def __eq__(self, other: object) -> bool:
            return True

    assert Loose(1) == Loose(2) and hash(Loose(1)) == hash((1,))


def test_a_record_that_holds_itself_is_shown_once() -> None:
    @record
    class Node:
        items: list[Any]

    n = Node([])
    n.items.append(n)
    assert repr(n).endswith("Node(items=[...])")


def test_eq_false_is_identity() -> None:
    @record(eq=False)
    class Handle:
        x: int

    a = Handle(1)
    assert a == a and a != Handle(1) and hash(a) == object.__hash__(a)
    assert repr(a) == "test_eq_false_is_identity.<locals>.Handle(x=1)"


def public_records() -> list[type]:
    found: dict[str, type] = {}
    for module in (cgroupfs, supervisor):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) and dataclasses.is_dataclass(value):
                found[name] = value
    return list(found.values())


@pytest.mark.parametrize("cls", public_records(), ids=lambda c: c.__qualname__)
def test_every_public_record_is_one_and_takes_what_its_dataclass_took(cls: type) -> None:
    """Each is a record (HandOver, the hand-over's mutable state, a plain dataclass), and its
    ``__init__`` has the signature ``dataclasses`` would make from the same fields."""
    if cls.__module__ == "supervisor._handover":
        assert cls.__dataclass_params__.frozen is False  # type: ignore[attr-defined]
        return
    assert "__slots__" in cls.__dict__ and "__record_fields__" in dir(cls)
    for method in ("__repr__", "__setattr__", "__delattr__", "__getstate__"):
        assert getattr(cls, method).__module__ == "cgroupfs._record", (cls, method)
    twin = dataclasses.make_dataclass(
        cls.__name__, [(f.name, f.type, f) for f in dataclasses.fields(cls)], frozen=True)
    assert str(inspect.signature(cls)) == str(inspect.signature(twin))
