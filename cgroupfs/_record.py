"""``record``: a frozen dataclass made with one compiled method instead of six.

Every record of ``cgroupfs`` and of the core (a task's result, its usage, its limits, a
cgroup's stats) is a frozen, slotted dataclass.  CPython (3.11 to 3.13) makes each method
of a dataclass by compiling its source text at import: six for a frozen one (``__init__``,
``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``), each through a
function made to make it, ~0.2 ms apiece on a slow machine, and a command-line start
(``corral run``) imports forty of them.  ``record`` has ``dataclasses`` read the fields and
make the slots and nothing else; it compiles the one method that depends on the class's
signature, ``__init__`` (what a frozen dataclass's is: each field set past ``__setattr__``,
a default or a ``default_factory`` for a field not given, then ``__post_init__``), and gives
every record the same ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``,
``__delattr__`` and pickling state, reading the fields' names from tuples kept on the
class.  They give what the generated ones give (the fields in order, ``init=False``,
``compare=False``, ``repr=False`` and ``hash=False`` honoured, another class never equal,
3.11's tuple comparison, ``FrozenInstanceError``); ``tests/cgroupfs_layer/
test_cgroupfs_record.py`` holds them to that.  Everything else is the dataclass's:
``dataclasses.fields``, ``replace``, ``asdict``, ``__match_args__``, and
``__dataclass_params__`` says what the class is (frozen, with ``__init__``, ``__repr__``
and, unless ``eq=False``, ``__eq__``).  What differs: ``pprint`` prints a record on one
line and pytest shows two reprs rather than the differing fields (both look for the
generated methods); ``InitVar`` and ``kw_only`` fields are refused; a record may be the base
of a frozen dataclass, not of another record.

    @record
    class CpuMax:
        quota_us: int | None
        period_us: int = 100_000

``@record(eq=False)``: identity equality and hash (an object that stands for one thing, not
a value), as ``dataclass(eq=False)``.
"""

from __future__ import annotations

import abc
import dataclasses
import reprlib
import sys
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


def _setattr(self: Any, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _getstate(self: Any) -> list[Any]:
    return [getattr(self, name) for name in self.__record_fields__]


def _setstate(self: Any, state: list[Any]) -> None:
    for name, value in zip(self.__record_fields__, state, strict=True):
        object.__setattr__(self, name, value)


class _Factory:
    """The default of a field with a ``default_factory``: it was not given."""

    def __repr__(self) -> str:
        return "<factory>"  # (as the dataclass's signature shows it)


_FACTORY = _Factory()


def _init(cls: Any, fields: tuple[dataclasses.Field[Any], ...]) -> Callable[..., None]:
    """``cls.__init__`` as a frozen dataclass's, compiled alone."""
    space: dict[str, Any] = {"__record_set__": object.__setattr__, "__record_factory__": _FACTORY}
    params, body = ["__record_self__"], []
    for f in fields:
        if f.kw_only:
            raise TypeError(f"record {cls.__qualname__}: kw_only fields are not supported")
        factory = f.default_factory is not dataclasses.MISSING
        fallback = None  # (the expression of the value a field not given takes)
        if f.default is not dataclasses.MISSING:
            space[f"__record_default_{f.name}"] = f.default
            fallback = f"__record_default_{f.name}"
        elif factory:
            space[f"__record_factory_{f.name}"] = f.default_factory
            fallback = f"__record_factory_{f.name}()"
        if not f.init:
            if fallback is None:
                continue  # (no default: left unset, as a dataclass leaves it)
            value = fallback
        elif factory:
            params.append(f"{f.name}=__record_factory__")
            value = f"{fallback} if {f.name} is __record_factory__ else {f.name}"
        else:
            params.append(f.name if fallback is None else f"{f.name}={fallback}")
            value = f.name
        body.append(f" __record_set__(__record_self__, {f.name!r}, {value})")
    if hasattr(cls, "__post_init__"):
        body.append(" __record_self__.__post_init__()")
    # Made inside a function whose parameters hold the defaults and helpers, and with the
    # module's globals, as dataclasses does: typing.get_type_hints(cls.__init__) then reads
    # the module's names, and nothing is added to the module.
    source = (f"def __record_make__({', '.join(space)}):\n"
              f" def __init__({', '.join(params)}):\n" + "\n".join(
                  " " + line for line in body or [" pass"]) + "\n return __init__")
    made: dict[str, Any] = {}
    try:
        exec(source, vars(sys.modules[cls.__module__]), made)  # (our own source)
    except SyntaxError as e:  # (a field without a default after one with)
        raise TypeError(f"record {cls.__qualname__}: {e.msg}") from None
    init: Callable[..., None] = made["__record_make__"](**space)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = {f.name: f.type for f in fields if f.init} | {"return": None}
    return init


def _make(cls: T, eq: bool) -> T:
    made: Any = dataclasses.dataclass(cls, init=False, repr=False, eq=False, slots=True)
    if any("InitVar" in str(f.type) for f in made.__dataclass_fields__.values()):
        raise TypeError(f"record {cls.__qualname__}: InitVar fields are not supported")
    fields = dataclasses.fields(made)
    made.__record_fields__ = tuple(f.name for f in fields)
    shared: dict[str, Callable[..., Any]] = {
        "__init__": _init(made, fields), "__repr__": _repr, "__setattr__": _setattr,
        "__delattr__": _delattr, "__getstate__": _getstate, "__setstate__": _setstate}
    made.__record_repr__ = tuple(f.name for f in fields if f.repr)
    if eq:
        made.__record_compare__ = tuple(f.name for f in fields if f.compare)
        made.__record_hash__ = tuple(f.name for f in fields
                                     if (f.compare if f.hash is None else f.hash))
        shared |= {"__eq__": _eq, "__hash__": _hash}
    own = dict(cls.__dict__)
    if own.get("__hash__", 0) is None and "__eq__" in own:
        del own["__hash__"]  # (Python's None for a class that wrote __eq__: not one it wrote)
    for name in ("__init__", "__setattr__", "__delattr__"):
        if name in own:  # (the fields are set by ours; a frozen dataclass refuses the others)
            raise TypeError(f"record {cls.__qualname__} may not write {name} itself")
    for name, fn in shared.items():
        if name not in own:  # (one the class wrote itself stays, as in a dataclass)
            setattr(made, name, fn)
    params = made.__dataclass_params__  # (what it is, not what dataclasses was asked for)
    params.init, params.repr, params.eq, params.frozen = True, True, eq, True
    abc.update_abstractmethods(made)
    return made  # type: ignore[no-any-return]


@overload
def record(cls: T, /) -> T: ...
@overload
def record(*, eq: bool = True) -> Callable[[T], T]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: T | None = None, /, *, eq: bool = True) -> T | Callable[[T], T]:
    """A frozen, slotted dataclass of ``cls``, its ``__init__`` compiled alone and its other
    methods shared (module docstring); ``eq=False``: identity equality and hash."""
    if cls is None:
        return lambda c: _make(c, eq)
    return _make(cls, eq)
