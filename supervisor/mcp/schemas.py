"""The tools' JSON Schemas (2020-12): what each takes, and the structured content each
answers with.  Pure data; the backends build dicts of these shapes, the tests validate every
answer against them."""

from __future__ import annotations

from typing import Any

from .backend import SIGNALS, STREAMS

__all__ = ["INPUT", "MAX_READ", "MAX_WAIT", "OUTCOMES", "OUTPUT", "STATES"]

OUTCOMES = ("succeeded", "failed", "signaled", "timed_out", "cancelled", "oom_killed",
            "spawn_failed", "lost")
STATES = ("queued", "starting", "running", "stopping", "finished")
MAX_WAIT = 600.0  # seconds a call may wait for a task
MAX_READ = 1 << 16  # bytes one output call returns

_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_OPT_STR = {"type": ["string", "null"]}
_OPT_INT = {"type": ["integer", "null"]}
_OPT_NUM = {"type": ["number", "null"]}
_STRINGS = {"type": "array", "items": _STR}


def _object(properties: dict[str, Any], required: tuple[str, ...] | None = None) -> dict[str, Any]:
    """An object of exactly these properties (all required unless ``required`` says)."""
    return {"type": "object", "properties": properties, "additionalProperties": False,
            "required": list(properties if required is None else required)}


_STREAM = _object({
    "head": _STR, "tail": _STR,
    "total_bytes": _INT, "dropped_bytes": _INT,
})
_CARRIED = {"anyOf": [
    _object({"cwd": _STR, "set": _STRINGS, "unset": _STRINGS}),
    _object({"nothing": _STR}),
    {"type": "null"},
]}
_SIGNAL_SENT = _object({"signal": _STR, "after_s": _NUM})
_TASK_FIELDS: dict[str, Any] = {
    "task_id": _STR,
    "session": _OPT_STR,
    "command": _STR,
    "background": {"type": "boolean"},
    "state": {"enum": list(STATES)},
    "outcome": {"enum": [*OUTCOMES, None]},
    "exit_code": _OPT_INT,
    "exit_signal": _OPT_STR,
    "exit_status": _OPT_INT,
    "time_limit_s": _OPT_NUM,
    "runtime_s": _OPT_NUM,
    "stdout": _STREAM,
    "stderr": _STREAM,
    "carried": _CARRIED,
    "cwd": _OPT_STR,
    "stop": _OPT_STR,
    "cleanup": _OPT_STR,
    "leftovers": _STRINGS,
    "signals": {"type": "array", "items": _SIGNAL_SENT},
    "notes": _STRINGS,
    "error": _OPT_STR,
}
TASK = _object(_TASK_FIELDS)
_BRIEF = _object({k: _TASK_FIELDS[k] for k in (
    "task_id", "session", "command", "background", "state", "outcome", "exit_code",
    "runtime_s")})
SESSION = _object({
    "session": _STR, "cwd": _STR, "shell": _STR, "current": _OPT_STR,
    "running": _STRINGS, "commands": _INT,
})

OUTPUT: dict[str, dict[str, Any]] = {
    "run": _object({**_TASK_FIELDS, "waited_s": _NUM, "note": _STR}),
    "output": _object({
        "task_id": _STR, "stream": {"enum": list(STREAMS)}, "offset": _INT,
        "next_offset": _INT, "text": _STR, "bytes": _INT, "total_bytes": _INT,
        "eof": {"type": "boolean"}, "state": {"enum": list(STATES)},
        "log_truncated": {"type": "boolean"}, "note": _OPT_STR,
    }),
    "signal": _object({"task_id": _STR, "signal": {"enum": list(SIGNALS)},
                       "sent": {"type": "boolean"}, "state": {"enum": list(STATES)}}),
    "stop": _object({**_TASK_FIELDS, "requested": {"type": "boolean"}, "waited_s": _NUM}),
    "list": _object({"tasks": {"type": "array", "items": _BRIEF},
                     "sessions": {"type": "array", "items": SESSION}}),
    "new_session": SESSION,
    "input": _object({"task_id": _STR, "written": _INT, "eof": {"type": "boolean"},
                      "state": {"enum": list(STATES)}}),
    "close_session": _object({"session": _STR, "stopped": _STRINGS}),
}

_TASK_ID = {"type": "string", "minLength": 1, "maxLength": 64,
            "description": "a task id, as run or list gave it"}
_SESSION_ID = {"type": "string", "minLength": 1, "maxLength": 64,
               "description": "a session id from new_session (default: the default session)"}
_WAIT = {"type": "number", "minimum": 0, "maximum": MAX_WAIT}

INPUT: dict[str, dict[str, Any]] = {
    "run": _object({
        "command": {"type": "string", "minLength": 1, "maxLength": 1 << 20,
                    "description": "shell command line, run as `bash -c` would"},
        "session": _SESSION_ID,
        "time_limit": {"type": ["string", "number"],
                       "description": 'e.g. "30s", "5min", or seconds; capped at the ceiling'},
        "wait": {**_WAIT, "description": "seconds to wait for the end before answering "
                                         "(default 30); the command goes on after"},
        "stdin": {"type": "string", "maxLength": 1 << 20,
                  "description": "text given as its standard input (default: none, "
                                 "/dev/null)"},
        "background": {"type": "boolean",
                       "description": "answer at once; carries nothing over to the session"},
        "cwd": {"type": "string", "minLength": 1, "maxLength": 4096,
                "description": "run it in this directory instead of the session's (absolute, "
                               "or relative to this server's); the directory it leaves "
                               "carries, as after a cd: the way out of a session whose "
                               "directory is gone"},
        "interactive": {"type": "boolean",
                        "description": "keep its stdin open for the input tool (a prompt, a "
                                       "REPL, an installer that asks); stdin, if given, is "
                                       "written first"},
    }, required=("command",)),
    "output": _object({
        "task_id": _TASK_ID,
        "stream": {"enum": list(STREAMS), "description": "default stdout"},
        "offset": {"type": "integer", "description": "byte offset to read from (default 0); "
                                                     "negative: that many bytes before the "
                                                     "end"},
        "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_READ,
                      "description": f"at most this many bytes (default 16384, at most "
                                     f"{MAX_READ})"},
        "wait": {**_WAIT, "description": "first wait this many seconds for the task to end "
                                         "(default 0)"},
    }, required=("task_id",)),
    "signal": _object({"task_id": _TASK_ID, "signal": {"enum": list(SIGNALS)}},
                      required=("task_id", "signal")),
    "stop": _object({"task_id": _TASK_ID,
                     "force": {"type": "boolean",
                               "description": "kill now instead of stop signal, grace, kill"}},
                    required=("task_id",)),
    "list": _object({"session": _SESSION_ID}, required=()),
    "input": _object({
        "task_id": _TASK_ID,
        "text": {"type": "string", "maxLength": 1 << 20,
                 "description": "written as it is (end a line with \\n to send it)"},
        "eof": {"type": "boolean", "description": "then close its stdin (end of input)"},
    }, required=("task_id", "text")),
    "close_session": _object({"session": {**_SESSION_ID, "description": "a session id from "
                                                                        "new_session"}},
                             required=("session",)),
    "new_session": _object({
        "cwd": {"type": "string", "minLength": 1,
                "description": "its working directory (default: the server's)"},
        "env": {"type": "object", "additionalProperties": {"type": "string"},
                "description": "variables to set over the server's environment"},
    }, required=()),
}
