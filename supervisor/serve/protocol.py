"""The daemon's wire protocol: what a request may say, what a response says.

One module that the server (``supervisor.serve``) and every client (``supervisor.client``, the
``corral submit|ps|show|wait|logs|stop`` verbs) share.  It imports neither trio nor the core,
nor ``dataclasses`` (which costs a client ~10 ms of start-up through ``inspect``), nor
``typing`` (~3 ms): typed results are ``NamedTuple`` s, made at run time by a stand-in with
typing's class syntax (:func:`_named_tuple_base`), so that type checkers see typing's.

Everything here is pure: bytes and dicts in, typed values or :class:`ApiError` out.  An
``ApiError`` carries the HTTP status and the JSON error body the daemon sends::

    {"error": {"code": "invalid", "message": "argv must be ...", "field": "argv"}}

whose message names the value, the rule and the fix.
"""

from __future__ import annotations

from . import fastjson

TYPE_CHECKING = False  # not typing's (see the module docstring)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NamedTuple

__all__ = [
    "API",
    "DEFAULT_SOCKET",
    "ITEM_WORK",
    "MAX_KEY",
    "OWN_SUFFIX",
    "SOCKET_ENV",
    "STATES",
    "ApiError",
    "Frame",
    "SubmitRequest",
    "TaskInfo",
    "body_work",
    "canonical_id",
    "parse_frame",
    "parse_json_body",
    "parse_stop",
    "parse_submit",
    "query_bool",
    "query_int",
    "shown",
    "sorted_in_slices",
]



def _named_tuple_base() -> Any:
    """``typing.NamedTuple``'s class syntax without importing typing, nor ``collections``
    (~2 ms of a client's start-up, for ``namedtuple`` alone): each class made from the
    returned base is a tuple of the annotated fields (in order), read by name, with their
    defaults, ``_fields``, ``_asdict`` and ``_replace``, and the class's methods and
    docstring."""
    from _operator import itemgetter

    skip = ("__annotations__", "__module__", "__qualname__", "__dict__", "__weakref__")

    def new(cls: Any, *args: Any, **kwargs: Any) -> Any:
        fields = cls._fields
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__} takes {len(fields)} values, got {len(args)}")
        values = list(args)
        for name in fields[len(args):]:
            if name in kwargs:
                values.append(kwargs.pop(name))
            elif name in cls._field_defaults:
                values.append(cls._field_defaults[name])
            else:
                raise TypeError(f"{cls.__name__}: missing {name!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}: unknown {', '.join(map(repr, kwargs))}")
        return tuple.__new__(cls, values)

    def asdict(self: Any) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))

    def replace(self: Any, **changes: Any) -> Any:
        return type(self)(*[changes.pop(f, v) for f, v in zip(self._fields, self, strict=True)],
                          **changes)

    def represent(self: Any) -> str:
        shown = ", ".join(f"{f}={v!r}" for f, v in zip(self._fields, self, strict=True))
        return f"{type(self).__name__}({shown})"

    def getnewargs(self: Any) -> tuple[Any, ...]:
        return tuple(self)

    class Meta(type):
        def __new__(mcls, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> Any:
            if not bases:
                return super().__new__(mcls, name, bases, ns)
            fields = tuple(ns.get("__annotations__", {}))
            body: dict[str, Any] = {
                "__slots__": (), "_fields": fields,
                "_field_defaults": {f: ns[f] for f in fields if f in ns},
                "__new__": new, "_asdict": asdict, "_replace": replace,
                "__repr__": represent, "__getnewargs__": getnewargs,
                "__match_args__": fields, "__module__": ns.get("__module__"),
                "__qualname__": ns.get("__qualname__", name)}
            body.update((i, property(itemgetter(n), doc=f"Alias for field number {n}"))
                        for n, i in enumerate(fields))
            body.update((k, v) for k, v in ns.items() if k not in fields and k not in skip)
            return type(name, (tuple,), body)

    return Meta("NamedTuple", (), {})


if not TYPE_CHECKING:
    NamedTuple = _named_tuple_base()

API = "/v1"
DEFAULT_SOCKET = "/run/corral/corral.sock"
SOCKET_ENV = "CORRAL_SOCKET"
# a uid's own socket beside the shared one at PATH: PATH + OWN_SUFFIX + "/" + str(uid)
# (serve/ownsockets.py; the clients use it when it is there: client.own_socket_of)
OWN_SUFFIX = ".uid"
STATES = ("queued", "starting", "running", "stopping", "finished")
MAX_TEXT = 4096  # a name: a sane bound for a label
# An idempotency key is kept in the task's row, its index, and after the task expires in its
# tombstone and that index too, a hundred thousand of them: 4,096 characters made each
# tombstone 8 KB and let one tenant fill a small state disk with keys in seconds.  A key names
# one submission: a UUID (36), or the clients' own "corral-" and 32 hex digits (39), fits.
MAX_KEY = 128  # bytes of an idempotency key, as UTF-8
MAX_ARGS = 65536  # argv items (the kernel's own limit is on total bytes)
MAX_COMMAND = 1 << 20  # characters of a session's command line (a heredoc of a file is fine)
LARGE_BODY = 64 << 10  # bytes of a body (or work) above which it is parsed off the event loop


class ApiError(Exception):
    """A refused request: HTTP ``status``, a machine-readable ``code``, the ``field`` at fault.

    The message names the value, the rule and the fix.
    """

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}

    @classmethod
    def from_response(cls, status: int, body: bytes) -> ApiError:
        """The error a daemon answered with (or a plain one if the body is not ours)."""
        try:
            err = fastjson.loads(body)["error"]
            return cls(status, str(err["code"]), str(err["message"]), err.get("field"))
        except (ValueError, KeyError, TypeError):
            text = body[:200].decode("utf-8", "replace")
            return cls(status, "http", f"HTTP {status}: {text}")


def invalid(field: str, message: str) -> ApiError:
    return ApiError(400, "invalid", message, field)


def shown(value: Any) -> str:
    """``value`` as JSON, at most 80 characters: how an answer names a bad value."""
    import json  # (the daemon's: json is not imported for the clients' types, see fastjson.py)

    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_SLICE = 1024  # items json encodes per call in dumps_in_slices


def dumps_in_slices(obj: dict[str, Any]) -> str:
    """``json.dumps(obj)``, exactly, with each long list or dict among ``obj``'s values
    encoded :data:`_SLICE` items at a time: json's C encoder keeps the GIL for a whole call
    (10 ms for a command of 65,000 arguments), and the event loop, in another thread, cannot
    run meanwhile; between slices it can."""
    import json

    if not any(isinstance(v, list | dict) and len(v) > _SLICE for v in obj.values()):
        return json.dumps(obj)
    return "{" + ", ".join(f"{json.dumps(key)}: {dumps_value_in_slices(value)}"
                           for key, value in obj.items()) + "}"


def sorted_in_slices(mapping: dict[str, str]) -> dict[str, str]:
    """``dict(sorted(mapping.items()))``, made :data:`_SLICE` items at a time: sorting the
    items (tuples) and making the dict of them were two calls of 10 ms each for 65,000
    variables, the GIL held throughout; the names alone sort in 2."""
    names = sorted(mapping)
    out: dict[str, str] = {}
    for i in range(0, len(names), _SLICE):
        out.update({name: mapping[name] for name in names[i:i + _SLICE]})
    return out


def dumps_value_in_slices(value: Any) -> str:
    """``json.dumps(value)``, exactly, a long list or dict :data:`_SLICE` items at a time."""
    import json

    if isinstance(value, list) and len(value) > _SLICE:
        return "[" + ", ".join(json.dumps(value[i:i + _SLICE])[1:-1]
                               for i in range(0, len(value), _SLICE)) + "]"
    if isinstance(value, dict) and len(value) > _SLICE:
        items = list(value.items())
        return "{" + ", ".join(json.dumps(dict(items[i:i + _SLICE]))[1:-1]
                               for i in range(0, len(items), _SLICE)) + "}"
    return json.dumps(value)


def parse_json_body(body: bytes) -> Any:
    """The request body as JSON; ApiError 400 for invalid UTF-8, malformed JSON, NaN."""
    import json

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, "invalid_utf8", f"the request body is not valid UTF-8 (byte "
                       f"0x{body[e.start]:02x} at offset {e.start}); send JSON encoded as "
                       f"UTF-8") from None
    if not text.strip():
        raise ApiError(400, "malformed_json", "the request body is empty; send a JSON object "
                       "like {\"argv\": [\"true\"]}")
    decoder = json.JSONDecoder(parse_constant=_no_constants, object_pairs_hook=_each_once)
    if body.count(b"{") + body.count(b"[") > MAX_CONTAINERS:
        decoder.scan_once = _counting_scanner(decoder)  # type: ignore[attr-defined]
    try:
        value = decoder.decode(text)
    except json.JSONDecodeError as e:
        raise ApiError(400, "malformed_json", f"the request body is not JSON: {e.msg} at line "
                       f"{e.lineno} column {e.colno}; send one JSON object") from None
    except _TooMany:
        raise ApiError(400, "too_many_values", f"the request body holds more than "
                       f"{MAX_CONTAINERS} objects and lists; a request's fields hold a handful "
                       f"(argv, env, properties, stdin): send the documented fields "
                       f"alone") from None
    except _Twice as e:
        raise invalid(e.key, f"the key {e.key!r} appears twice in one object of the request "
                             f"body: JSON parsers differ on which one counts (a filter in "
                             f"front of the daemon may read the first, the daemon the last); "
                             f"send each key once") from None
    except (ValueError, RecursionError) as e:
        raise ApiError(400, "malformed_json", f"the request body is not JSON: {e}; send one "
                       f"JSON object without NaN, Infinity or deep nesting") from None
    if _ESCAPED_SURROGATE.search(text) is not None:  # (else no lone surrogate can be there)
        _no_lone_surrogates(value)
    return value


# The objects and lists a request body may hold: a request's own fields hold a handful.  A
# body with more ``{`` and ``[`` than this (strings may hold them too) is parsed by the json
# module's Python scanner, which counts them as it makes them and stops past the bound
# (:func:`_counting_scanner`): the C one makes the whole value in one call holding the GIL,
# the event loop waiting for it whatever thread runs it (a MiB of empty objects: 70-150 ms
# in one call; of empty lists 50-86), and made it only for it to be refused; the Python one
# counted to the end a MiB of them, 375 ms of CPU in calls of microseconds for each body (an
# independent attack's bodies one after another: another tenant's p99 61-123 ms).
MAX_CONTAINERS = 1024


class _TooMany(ValueError):
    pass


def _counting_scanner(decoder: Any) -> Any:
    """``decoder``'s scanner, the json module's Python one (strings read by C), raising
    :class:`_TooMany` at the object or list past :data:`MAX_CONTAINERS`."""
    import json.decoder
    import json.scanner

    made = 0

    def counted(parse: Callable[..., Any]) -> Callable[..., Any]:
        def each(*args: Any) -> Any:
            nonlocal made
            made += 1
            if made > MAX_CONTAINERS:
                raise _TooMany
            return parse(*args)
        return each

    decoder.parse_object = counted(json.decoder.JSONObject)  # type: ignore[attr-defined]
    decoder.parse_array = counted(json.decoder.JSONArray)  # type: ignore[attr-defined]
    return json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]


class _Twice(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _each_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused (:class:`_Twice`) if a key appears in it twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Twice(key)
            seen.add(key)
    return obj


class _LazyPattern:
    """A regular expression compiled at its first use (``re`` costs a client's start-up)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.compiled: Any = None

    def search(self, text: str) -> Any:
        if self.compiled is None:
            import re

            self.compiled = re.compile(self.pattern)
        return self.compiled.search(text)


# A lone surrogate can only come from a JSON escape (UTF-8 cannot encode one): one search of
# the text spares walking every string of a large request
_ESCAPED_SURROGATE = _LazyPattern(r"\\[uU][dD][89a-fA-F]")


def _no_lone_surrogates(value: Any) -> None:
    """JSON's "\\udcff" escapes decode to text that is not Unicode (a lone surrogate): no
    record, log or terminal can hold it.  ApiError 400 naming where it is.  (The place is
    described only once one is found: a request may hold a hundred thousand strings.)"""
    path = _lone_surrogate_at(value, [])
    if path is None:
        return
    text, index, keys = path
    field = None if not keys else str(keys[0])
    where = "the request" if not keys else (
        str(keys[0]) + "".join(f"[{shown(k)}]" for k in keys[1:]))
    raise ApiError(400, "invalid_utf8", f"{where} holds a lone surrogate "
                   f"(\\u{ord(text[index]):04x} at character {index}), which is not text; "
                   f"send UTF-8 text", field)


def _lone_surrogate_at(value: Any, keys: list[Any]) -> tuple[str, int, list[Any]] | None:
    """(the string, the character, the keys on the way) of the first lone surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return value, e.start, keys
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for k, v in items:
        if isinstance(k, str):
            found = _lone_surrogate_at(k, [*keys, "(a field name)"])
            if found is not None:
                return found
        found = _lone_surrogate_at(v, [*keys, k])
        if found is not None:
            return found
    return None


def _object(obj: Any, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise invalid(what, f"{what} must be a JSON object, got {shown(obj)}")
    return obj


def _check_fields(obj: dict[str, Any], known: tuple[str, ...], what: str) -> None:
    for key in obj:
        if key not in known:
            raise ApiError(400, "unknown_field", f"unknown field {shown(key)} in {what}; the "
                           f"fields are: {', '.join(known)}", key)


def _string(obj: dict[str, Any], key: str, *, limit: int = MAX_TEXT) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(key, f"{key} must be a string, got {shown(value)}")
    if len(value) > limit:
        raise invalid(key, f"{key} must be at most {limit} characters, got {len(value)}")
    return value


def _key(obj: dict[str, Any]) -> str | None:
    """The request's ``idempotency_key``: a string of at most :data:`MAX_KEY` bytes."""
    value = _string(obj, "idempotency_key")
    if value is not None and len(value.encode("utf-8", "surrogatepass")) > MAX_KEY:
        raise invalid("idempotency_key", f"idempotency_key must be at most {MAX_KEY} bytes "
                      f"(UTF-8), got {len(value.encode('utf-8', 'surrogatepass'))}: a key names "
                      f"one submission; use a UUID, or a hash of what makes it unique")
    if value is not None and not value.isprintable():
        raise invalid("idempotency_key", f"idempotency_key must be printable (no control "
                      f"character, NUL included), got {value!r}: a key names one "
                      f"submission; use a UUID, or a hash of what makes it unique")
    return value


def _duration(obj: dict[str, Any], key: str) -> str | float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise invalid(key, f"{key} must be a duration like \"30s\" or \"5min\" (or a number "
                           f"of seconds), got {shown(value)}")
    return value


def _string_map(obj: dict[str, Any], key: str, *, numbers: bool = False) -> dict[str, str]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(key, f"{key} must be an object of names to strings, got {shown(value)}")
    out = {}
    for k, v in value.items():
        if numbers and isinstance(v, int | float) and not isinstance(v, bool):
            v = str(v)
        if not isinstance(v, str):
            raise invalid(key, f"{key}[{shown(k)}] must be a string, got {shown(v)}")
        out[k] = v
    return out


def _argv(obj: dict[str, Any]) -> list[str]:
    argv = obj.get("argv")
    if argv is None:
        raise invalid("argv", "argv is required: the command as a list of strings, like "
                              "[\"make\", \"test\"]")
    if not isinstance(argv, list) or not argv:
        raise invalid("argv", f"argv must be a non-empty list of strings like [\"make\", "
                              f"\"test\"], got {shown(argv)}")
    if len(argv) > MAX_ARGS:
        raise invalid("argv", f"argv must have at most {MAX_ARGS} items, got {len(argv)}")
    for item in argv:
        if not isinstance(item, str):
            raise invalid("argv", f"argv items must be strings, got {shown(item)} in "
                                  f"{shown(argv)}")
    return argv


def _stdin(obj: dict[str, Any]) -> tuple[str | None, bytes | None]:
    """("pipe" or None, bytes to feed or None)."""
    value = obj.get("stdin")
    if value is None:
        return None, None
    if value == "pipe":
        return "pipe", None
    if isinstance(value, dict) and len(value) == 1:
        if isinstance(value.get("text"), str):
            return None, value["text"].encode("utf-8", "surrogatepass")
        if isinstance(value.get("base64"), str):
            import base64

            try:
                return None, base64.b64decode(value["base64"], validate=True)
            except ValueError:
                raise invalid("stdin", "stdin.base64 is not valid base64; encode the bytes "
                                       "with standard base64 (RFC 4648)") from None
    raise invalid("stdin", f"stdin must be null (/dev/null), \"pipe\" (write it with POST "
                           f"/v1/tasks/ID/stdin), {{\"text\": \"...\"}} or {{\"base64\": "
                           f"\"...\"}}, got {shown(value)}")


# what one item of a request (an argument, a variable of its environment; a quoted string of a
# body, a quarter) counts as, in bytes, where the daemon asks whether the work it makes is to be
# done off its event loop (``Daemon.off_loop``): each is walked in Python at ~0.5-1 us, what
# ~250 bytes of one long value cost; counted by bytes alone, a session's 3,000 variables
# in 33 KB were worked on the loop at every command, 5-10 ms each time (an independent attack)
ITEM_WORK = 256


def body_work(body: bytes) -> int:
    """The work a request body makes, in bytes (:data:`ITEM_WORK`)."""
    return len(body) + ITEM_WORK * body.count(b'"') // 4


class SubmitRequest(NamedTuple):
    """``POST /v1/tasks``: what a client may ask for (checked for shape here, for meaning by
    the core's TaskSpec and property parser in the daemon)."""

    argv: list[str]
    env: dict[str, str] | None = None
    cwd: str | None = None
    time_limit: str | float | None = None
    grace: str | float | None = None
    stop_signal: str | int | None = None
    properties: dict[str, str] | None = None
    name: str | None = None
    stdin: str | None = None  # "pipe" or None
    stdin_data: bytes | None = None
    idempotency_key: str | None = None
    # a session's command (the daemon makes these: never from POST /v1/tasks): ``{"id",
    # "command", "background", "exact_env"}``; ``exact_env``: ``env`` is the whole
    # environment (carried from the command before), no login-like base under it
    session: dict[str, Any] | None = None
    tty: dict[str, int] | None = None  # {"rows", "cols"}: a pseudo-terminal of its own

    def work(self, size: int) -> int:
        """The work it makes, in bytes (:data:`ITEM_WORK`), as ``size`` bytes."""
        return size + ITEM_WORK * (len(self.argv) + len(self.env or ()))

    def to_json(self) -> dict[str, Any]:
        """The request as JSON (what a client sends, what the daemon records)."""
        out: dict[str, Any] = {"argv": list(self.argv)}
        for key in ("env", "cwd", "time_limit", "grace", "stop_signal", "properties", "name",
                    "idempotency_key", "session", "tty"):
            value = getattr(self, key)
            if value is not None and value != {}:
                out[key] = value
        if self.stdin == "pipe":
            out["stdin"] = "pipe"
        elif self.stdin_data is not None:
            import base64

            out["stdin"] = {"base64": base64.b64encode(self.stdin_data).decode("ascii")}
        return out


SUBMIT_FIELDS = (*SubmitRequest._fields[:8], "stdin", "idempotency_key", "tty")
MAX_TTY = 10000  # rows or columns of a task's terminal


def parse_tty(obj: dict[str, Any]) -> dict[str, int] | None:
    """``"tty": {"rows": 24, "cols": 80}`` (``true``: 24 x 80); None without one."""
    value = obj.get("tty")
    if value is None or value is False:
        return None
    if value is True:
        return {"rows": 24, "cols": 80}
    if isinstance(value, dict) and set(value) == {"rows", "cols"} and all(
            isinstance(value[k], int) and not isinstance(value[k], bool)
            and 1 <= value[k] <= MAX_TTY for k in ("rows", "cols")):
        return {"rows": value["rows"], "cols": value["cols"]}
    raise invalid("tty", f"tty must be true or {{\"rows\": 24, \"cols\": 80}} (each 1 to "
                         f"{MAX_TTY}), got {shown(value)}")


def parse_submit(obj: Any, *, recorded: bool = False) -> SubmitRequest:
    """Check a submission's shape: fields, types; ApiError 400 naming the field.
    ``recorded``: a request as the daemon recorded it (a session's command has ``session``)."""
    obj = _object(obj, "the request body")
    session = obj.get("session") if recorded else None
    if session is not None:
        obj = {k: v for k, v in obj.items() if k != "session"}
    _check_fields(obj, SUBMIT_FIELDS, "a task submission")
    cwd = _cwd(obj)
    signal = obj.get("stop_signal")
    if signal is not None and (isinstance(signal, bool) or not isinstance(signal, str | int)):
        raise invalid("stop_signal", f"stop_signal must be a signal name like \"TERM\" or a "
                                     f"number, got {shown(signal)}")
    stdin, stdin_data = _stdin(obj)
    return SubmitRequest(
        argv=_argv(obj), env=_string_map(obj, "env"), cwd=cwd,
        time_limit=_duration(obj, "time_limit"), grace=_duration(obj, "grace"),
        stop_signal=signal, properties=_string_map(obj, "properties", numbers=True),
        name=_string(obj, "name"), stdin=stdin, stdin_data=stdin_data,
        idempotency_key=_key(obj), session=session, tty=parse_tty(obj))


def _cwd(obj: dict[str, Any]) -> str | None:
    cwd = _string(obj, "cwd")
    if cwd is not None and not cwd.startswith("/"):
        raise invalid("cwd", f"cwd must be an absolute path, got {shown(cwd)}")
    return cwd


MAX_WAIT = 3600.0  # seconds a request may wait for its task (a long poll: wait again)


def pop_wait(obj: Any) -> float | None:
    """Take ``wait`` (a duration: answer when the task ends or this passes) out of a request
    body; None if it has none.  ApiError 400 for a bad one."""
    if not isinstance(obj, dict) or obj.get("wait") is None:
        if isinstance(obj, dict):
            obj.pop("wait", None)
        return None
    return wait_duration(obj.pop("wait"), "wait")


def wait_duration(value: Any, field: str) -> float:
    from ..syntax import UnitsError, parse_duration

    try:
        seconds = parse_duration(value, field, allow_zero=True)
    except UnitsError as e:
        raise invalid(field, str(e)) from None
    if seconds > MAX_WAIT:
        raise invalid(field, f"{field} must be at most 1h, got {shown(value)}; wait again "
                      f"after it passes (GET /v1/tasks/ID/wait)")
    return seconds


class SessionRequest(NamedTuple):
    """``POST /v1/sessions``: a session's start (each command's defaults)."""

    cwd: str | None = None
    env: dict[str, str] | None = None
    shell: str | None = None
    time_limit: str | float | None = None
    grace: str | float | None = None
    properties: dict[str, str] | None = None


def parse_session(obj: Any) -> SessionRequest:
    obj = _object(obj, "the request body")
    _check_fields(obj, SessionRequest._fields, "a session")
    cwd, shell = _string(obj, "cwd"), _string(obj, "shell", limit=4096)
    for key, value in (("cwd", cwd), ("shell", shell)):
        if value is not None and not value.startswith("/"):
            raise invalid(key, f"{key} must be an absolute path, got {shown(value)}")
    return SessionRequest(cwd=cwd, env=_string_map(obj, "env"), shell=shell,
                          time_limit=_duration(obj, "time_limit"),
                          grace=_duration(obj, "grace"),
                          properties=_string_map(obj, "properties", numbers=True))


class ExecRequest(NamedTuple):
    """``POST /v1/sessions/ID/exec``: one command of a session."""

    command: str
    background: bool = False
    time_limit: str | float | None = None
    grace: str | float | None = None
    name: str | None = None
    stdin: str | None = None
    stdin_data: bytes | None = None
    idempotency_key: str | None = None
    tty: dict[str, int] | None = None
    cwd: str | None = None  # this command's directory, instead of the session's


EXEC_FIELDS = ("command", "background", "time_limit", "grace", "name", "stdin",
               "idempotency_key", "tty", "cwd")


def parse_exec(obj: Any) -> ExecRequest:
    obj = _object(obj, "the request body")
    _check_fields(obj, EXEC_FIELDS, "a session's command")
    command = _string(obj, "command", limit=MAX_COMMAND)
    if not command or not command.strip():
        raise invalid("command", "command is required: the shell command line to run, like "
                                 "\"cd src && make\"")
    if "\0" in command:
        raise invalid("command", "command must not contain NUL characters")
    background = obj.get("background", False)
    if not isinstance(background, bool):
        raise invalid("background", f"background must be true or false, got "
                                    f"{shown(background)}")
    stdin, stdin_data = _stdin(obj)
    return ExecRequest(command, background, _duration(obj, "time_limit"),
                       _duration(obj, "grace"), _string(obj, "name"), stdin, stdin_data,
                       _key(obj), parse_tty(obj), _cwd(obj))


def parse_resize(obj: Any) -> tuple[int, int]:
    """``{"rows": 40, "cols": 120}`` -> (rows, cols)."""
    obj = _object(obj, "the request body")
    tty = parse_tty({"tty": obj})
    assert tty is not None
    return tty["rows"], tty["cols"]


SIGNALS = ("INT", "QUIT", "HUP", "TERM", "USR1", "USR2", "WINCH", "CONT")


def parse_signal(obj: Any) -> str:
    """``{"signal": "INT"}`` -> "INT" (one of :data:`SIGNALS`; "SIGINT" is taken too)."""
    obj = _object(obj, "the request body")
    _check_fields(obj, ("signal",), "a signal request")
    name = obj.get("signal")
    if isinstance(name, str) and name.upper().removeprefix("SIG") in SIGNALS:
        return name.upper().removeprefix("SIG")
    if name in ("KILL", "SIGKILL", "STOP", "SIGSTOP"):
        raise invalid("signal", f"signal {shown(name)} is not sent this way: POST "
                      f"/v1/tasks/ID/stop {{\"force\": true}} kills the task's whole tree")
    raise invalid("signal", f"signal must be one of {', '.join(SIGNALS)}, got {shown(name)}")


def parse_stop(obj: Any) -> bool:
    """``POST /v1/tasks/ID/stop``'s body (may be empty: ``b""`` is ``{}``): ``force``."""
    obj = _object(obj, "the request body")
    _check_fields(obj, ("force",), "a stop request")
    force = obj.get("force", False)
    if not isinstance(force, bool):
        raise invalid("force", f"force must be true or false, got {shown(force)}")
    return force


def query_bool(query: dict[str, str], name: str, default: bool = False) -> bool:
    value = query.get(name)
    if value is None:
        return default
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise invalid(name, f"?{name}= must be true or false, got {shown(value)}")


MAX_ID_DIGITS = 18  # below 2**63: what SQLite's INTEGER holds


def canonical_id(task_id: str) -> bool:
    """Whether ``task_id`` is a task (or session) id as the daemon writes them: a decimal
    number without leading zeros, of at most :data:`MAX_ID_DIGITS` digits."""
    return (task_id.isascii() and task_id.isdigit() and len(task_id) <= MAX_ID_DIGITS
            and task_id[0] != "0")


def query_int(query: dict[str, str], name: str, default: int, low: int = 0,
              high: int = 2**62) -> int:
    value = query.get(name)
    if value is None:
        return default
    if not value.isascii() or not value.isdigit() or len(value.lstrip("0")) > len(str(high)) or \
            not low <= int(value) <= high:  # (its length first: int() of 5,000 digits raises)
        raise invalid(name, f"?{name}= must be a whole number from {low} to {high}, got "
                            f"{shown(value)}")
    return int(value)


class Frame(NamedTuple):
    """One NDJSON line of ``GET /v1/tasks/ID/output``.

    ``kind`` is ``"data"`` (``stream``, ``offset``, ``data``), ``"gap"`` (bytes ``offset`` to
    ``end`` are no longer held), or ``"end"`` (``finished``; ``result`` and ``exit_status``
    once the task ended, ``offset`` where to resume while it runs).
    """

    kind: str
    stream: str | None = None
    offset: int = 0
    data: bytes = b""
    end: int = 0
    finished: bool = False
    result: dict[str, Any] | None = None
    exit_status: int | None = None


def gap_frame(stream: str, start: int, end: int) -> dict[str, Any]:
    return {"stream": stream, "gap": [start, end]}


def parse_frame(line: bytes) -> Frame:
    obj = fastjson.loads(line)
    if "gap" in obj:
        start, end = obj["gap"]
        return Frame("gap", obj.get("stream"), start, end=end)
    if "end" in obj:
        return Frame("end", obj.get("stream"), obj.get("offset", 0), finished=bool(obj["end"]),
                     result=obj.get("result"), exit_status=obj.get("exit_status"))
    import base64

    return Frame("data", obj["stream"], obj["offset"], base64.b64decode(obj["data"]))


class TaskInfo(NamedTuple):
    """A task as the daemon reports it (``GET /v1/tasks/ID``; ``result`` once finished).

    ``result`` is the core's result JSON (``TaskResult.to_dict()``, the same as ``corral run
    --json-file``, docs/result.md) passed through as it is; ``outcome`` and ``exit_status``
    (what ``corral run`` would exit with) are the daemon's summary of it.
    """

    id: str
    state: str
    argv: list[str]
    uid: int
    gid: int
    name: str | None = None
    created_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    pid: int | None = None
    outcome: str | None = None
    exit_status: int | None = None
    queue_position: int | None = None
    spec: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    session: str | None = None  # a session's command: its session, and what it carried
    carried: dict[str, Any] | None = None
    signals: list[dict[str, Any]] | None = None  # sent so far (the result has them all)
    # an answer at a wait bound while it runs: per stream, its head and tail so far
    output: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TaskInfo:
        return tuple.__new__(cls, [obj.get(k) for k in cls._fields])
