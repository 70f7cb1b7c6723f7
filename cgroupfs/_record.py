"""``record``: a frozen dataclass whose ``__repr__``, ``__eq__`` and ``__hash__`` are shared.

Every public record of ``cgroupfs`` and ``supervisor`` (a task's result, its usage, its
limits, a cgroup's stats) is a frozen, slotted dataclass.  CPython (3.11 to 3.13) makes
each method of a dataclass by compiling its source text at import: six for a frozen one
(``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``),
~0.2 ms each on a slow machine, and a command-line start (``corral run``) imports forty of
them.  ``record`` has ``dataclasses`` make the three that depend on the class's own
signature or are frozen's (``__init__``, ``__setattr__``, ``__delattr__``) and gives the
class the other three as functions shared by every record, which read the fields' names
from a tuple kept on the class: the same results as the generated methods (the fields in
order, ``compare=False`` and ``repr=False`` honoured, another class never equal, 3.11's
tuple comparison), made once.  Everything else is the dataclass's: ``dataclasses.fields``,
``replace``, ``asdict``, ``__match_args__``, pickling, ``FrozenInstanceError``.  What
differs: ``__dataclass_params__`` says ``repr=False, eq=False`` (what ``dataclasses`` was
asked to make), so ``pprint`` prints a record on one line and pytest shows two reprs
rather than the differing fields.

    @record
    class CpuMax:
        quota_us: int | None
        period_us: int = 100_000

``@record(eq=False)``: identity equality and hash (an object that stands for one thing, not
a value), as ``dataclass(eq=False)``.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["record"]

T = TypeVar("T", bound=type)


@reprlib.recursive_repr()
def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__record_repr__)
    return f"{type(self).__qualname__}({shown})"


def _eq(self: Any, other: Any) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented  # type: ignore[no-any-return]
    names = self.__record_compare__
    return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, n) for n in self.__record_hash__))


def _make(cls: T, eq: bool) -> T:
    made: Any = dataclasses.dataclass(cls, frozen=True, slots=True, repr=False, eq=False)
    fields = dataclasses.fields(made)
    shared: dict[str, Callable[..., Any]] = {"__repr__": _repr}
    made.__record_repr__ = tuple(f.name for f in fields if f.repr)
    if eq:
        made.__record_compare__ = tuple(f.name for f in fields if f.compare)
        made.__record_hash__ = tuple(f.name for f in fields
                                     if (f.compare if f.hash is None else f.hash))
        shared |= {"__eq__": _eq, "__hash__": _hash}
    own = dict(cls.__dict__)
    if own.get("__hash__", 0) is None and "__eq__" in own:
        del own["__hash__"]  # (Python's None for a class that wrote __eq__: not one it wrote)
    for name, fn in shared.items():
        if name not in own:  # (one the class wrote itself stays, as in a dataclass)
            setattr(made, name, fn)
    return made  # type: ignore[no-any-return]


@overload
def record(cls: T, /) -> T: ...
@overload
def record(*, eq: bool = True) -> Callable[[T], T]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: T | None = None, /, *, eq: bool = True) -> T | Callable[[T], T]:
    """A frozen, slotted dataclass of ``cls`` with the shared ``__repr__``, ``__eq__`` and
    ``__hash__`` (module docstring); ``eq=False``: identity equality and hash."""
    if cls is None:
        return lambda c: _make(c, eq)
    return _make(cls, eq)
