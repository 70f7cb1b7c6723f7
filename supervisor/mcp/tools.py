"""The MCP tools: their descriptions (the limits in force, what the outcomes mean), one
handler per tool, and the one place a call becomes a ``CallToolResult``.

A result carries ``structuredContent`` (the tool's declared output schema) and the same as
JSON text.  ``isError`` only when nothing ran or the tool failed: a bad argument, an unknown
id, a signal to a task that has ended.  A command that exits non-zero, times out or is
killed is data (``outcome``, ``exit_code``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # (the SDK's own dependency)
import mcp_types as types
import trio
from mcp.server import ServerRequestContext

from ..syntax import format_duration
from .backend import SIGNALS, Backend, Limits, Refused, RunRequest, SessionRequest
from .schemas import INPUT, MAX_WAIT, OUTPUT

__all__ = ["call", "instructions", "tool_list"]

log = logging.getLogger(__name__)

DEFAULT_WAIT = 30.0  # seconds run waits for the end before answering
PROGRESS_EVERY = 1.0  # seconds between progress notifications while a call waits
STOP_WAIT_EXTRA = 2.0  # seconds stop waits past the grace for the record

OUTCOME_MEANINGS = (
    "succeeded (exit 0), failed (exit non-zero: see exit_code), signaled (a signal ended it, "
    "nobody asked: exit_signal), timed_out (stopped at its time limit), cancelled (stopped "
    "by a stop call, a cancelled request, or the server closing), oom_killed (the kernel's "
    "OOM killer: over its memory limit), spawn_failed (it never ran: see error), lost (the "
    "supervisor could not follow it to its end)")

Context = ServerRequestContext[Any, Any]
Handler = Callable[[Backend, Context, dict[str, Any]], Awaitable[dict[str, Any]]]


def _duration(seconds: float | None) -> str:
    return "none" if seconds is None else format_duration(seconds)


def _policy(limits: Limits) -> str:
    controllers = ", ".join(limits.controllers) or "none (only time limits and containment)"
    props = ", ".join(limits.properties) or "none"
    return (f"Time limit: {_duration(limits.default_time_limit)} unless a run gives one; "
            f"ceiling {_duration(limits.max_time_limit)} (a longer one is capped). At the "
            f"limit, or on stop: the stop signal to every process of the command, "
            f"{_duration(limits.grace)} of grace, then all are killed. cgroup controllers: "
            f"{controllers}. Properties on every command: {props}. Nothing here changes "
            f"this policy.")


def instructions(limits: Limits) -> str:
    where = ("an in-process supervisor: every task ends when this server exits (its host "
             "closing stdin)" if limits.backend == "in-process" else
             "the corral serve daemon: tasks outlive this server and its host")
    return (f"corral runs each shell command as a task of its own in a cgroup: its whole "
            f"process tree is contained, limited and stopped together, and its record says "
            f"how it ended. Backend: {where}. Commands run in a session (`{limits.shell} -c`): "
            f"the working directory and exported variables a command leaves carry to the next, "
            f"as in an interactive shell. {_policy(limits)} "
            + " ".join(limits.notes))


def tool_list(limits: Limits) -> list[types.Tool]:
    keep = limits.output_keep
    descriptions = {
        "run": (
            f"Run a shell command in a session (default: the default session, made on first "
            f"use; new_session makes others). cd, export and unset carry over to the next "
            f"command when it ends by itself (succeeded or failed); `carried` says what did. "
            f"stdin is empty (/dev/null) unless given (interactive: kept open for the input "
            f"tool). The answer comes when the command ends "
            f"or after `wait` seconds (default {DEFAULT_WAIT:g}), whichever is first: a "
            f"command still running goes on (state running, its task_id): read it with "
            f"output, end it with stop. background: answer at once, carry nothing. Output: "
            f"the first and last {keep // 1024} KiB of stdout and of stderr, dropped_bytes "
            f"counting what is between (read it with output). Outcomes: {OUTCOME_MEANINGS}. "
            f"A non-zero exit is not an error of this tool. {_policy(limits)}"),
        "output": (
            "Read a task's stdout or stderr from a byte offset (negative: from the end), "
            "while it runs or after it ended; next_offset is where to go on, eof says the "
            "task ended and all was read. wait: first wait up to that many seconds for the "
            "task to end."),
        "signal": (
            f"Send a signal ({', '.join(SIGNALS)}) to every process of a running task's tree, "
            f"without stopping it: INT as Ctrl-C would, CONT to resume. To end a task use "
            f"stop (recorded as cancelled, with grace, then kill)."),
        "stop": (
            f"Stop a task's whole process tree: the stop signal, {_duration(limits.grace)} "
            f"of grace, then kill; force: kill now. Answers once it ended (or after the "
            f"grace), with its outcome (cancelled)."),
        "list": ("The tasks of this server (state, outcome, exit code) and the sessions "
                 "(working directory, running tasks), of one session or all."),
        "new_session": ("Open a new session: its own working directory and environment "
                        "(set over the server's), carried from one command to the next. "
                        "Returns its id, for run's session."),
        "input": ("Type text into the stdin of a task run with interactive: true (answer a "
                  "prompt, feed a REPL); end a line with \\n. eof: then end its input. Its "
                  "answer shows in output."),
        "close_session": ("Close a session: every command of it still running is stopped "
                          "(each still recorded); it takes no more commands."),
    }
    annotations = {
        "run": types.ToolAnnotations(destructive_hint=True, open_world_hint=True),
        "output": types.ToolAnnotations(read_only_hint=True),
        "signal": types.ToolAnnotations(destructive_hint=True),
        "stop": types.ToolAnnotations(destructive_hint=True, idempotent_hint=True),
        "list": types.ToolAnnotations(read_only_hint=True),
        "new_session": types.ToolAnnotations(destructive_hint=False),
        "input": types.ToolAnnotations(destructive_hint=False),
        "close_session": types.ToolAnnotations(destructive_hint=True, idempotent_hint=True),
    }
    return [types.Tool(name=name, description=descriptions[name], input_schema=INPUT[name],
                       output_schema=OUTPUT[name], annotations=annotations[name])
            for name in HANDLERS]


async def call(backend: Backend, ctx: Context, name: str,
               arguments: dict[str, Any] | None) -> types.CallToolResult:
    """Run tool ``name``: its arguments checked against its input schema, then its handler;
    a refusal (nothing done) or a failure becomes a result with isError."""
    handler = HANDLERS.get(name)
    if handler is None:
        return _error(f"no tool {name!r}; the tools are {', '.join(HANDLERS)}")
    args = arguments or {}
    problem = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(INPUT[name]).iter_errors(args))
    if problem is not None:
        where = "/".join(str(p) for p in problem.absolute_path) or "arguments"
        return _error(f"{name}: {where}: {problem.message}")
    try:
        content = await handler(backend, ctx, args)
    except Refused as e:
        return _error(f"{name}: {e}")
    except ValueError as e:  # the supervisor's own refusals (SpecError, ConfigError)
        return _error(f"{name}: {e}")
    except OSError as e:
        log.exception("tool %s failed", name)
        return _error(f"{name} failed: {e}")
    text = json.dumps(content, ensure_ascii=False, indent=1)
    return types.CallToolResult(content=[types.TextContent(text=text)],
                                structured_content=content)


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


async def _wait_reporting(backend: Backend, ctx: Context, task_id: str, bound: float,
                          t0: float) -> float:
    """Wait until ``bound`` seconds after ``t0`` for the task to end, with a progress
    notification each second (sent only when the request has a progress token); the seconds
    waited since ``t0``.

    Cancellation (``notifications/cancelled``, the server closing): the task is stopped
    gracefully, shielded, and its record is still made; then Cancelled goes on."""
    try:
        while (left := t0 + bound - trio.current_time()) > 0:
            if await backend.wait(task_id, min(PROGRESS_EVERY, left)):
                break
            waited = trio.current_time() - t0
            await ctx.session.report_progress(
                min(waited, bound), bound, f"task {task_id} running, {waited:.0f}s waited")
    except trio.Cancelled:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await backend.stop(task_id, force=False)
        raise
    return round(trio.current_time() - t0, 3)


async def _run(backend: Backend, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    background = bool(args.get("background", False))
    bound = 0.0 if background else float(args.get("wait", DEFAULT_WAIT))
    t0 = trio.current_time()
    task_id = await backend.start(RunRequest(
        args["command"], args.get("session"), args.get("time_limit"), args.get("stdin"),
        background, bool(args.get("interactive", False)), min(bound, PROGRESS_EVERY),
        args.get("cwd")))
    waited = await _wait_reporting(backend, ctx, task_id, bound, t0)
    view = await backend.view(task_id)
    if view["state"] == "finished":
        note = f"finished: {view['outcome']}"
    elif background:
        note = "started in the background; it carries nothing over to the session"
    else:
        note = (f"still running after the {bound:g}s wait bound; it goes on (task "
                f"{task_id}): read more with output, wait with output's wait, end it with stop")
    return {**view, "waited_s": waited, "note": note}


async def _output(backend: Backend, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    task_id = args["task_id"]
    wait = float(args.get("wait", 0))
    if wait > 0:
        await _wait_quietly(backend, task_id, wait)
    return await backend.output(task_id, args.get("stream", "stdout"), args.get("offset", 0),
                                args.get("max_bytes", 16384))


async def _wait_quietly(backend: Backend, task_id: str, bound: float) -> float:
    t0 = trio.current_time()
    await backend.wait(task_id, min(bound, MAX_WAIT))
    return round(trio.current_time() - t0, 3)


async def _signal(backend: Backend, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    return await backend.signal(args["task_id"], args["signal"])


async def _stop(backend: Backend, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    task_id = args["task_id"]
    requested = await backend.stop(task_id, force=bool(args.get("force", False)))
    waited = await _wait_quietly(backend, task_id, backend.limits().grace + STOP_WAIT_EXTRA)
    return {**await backend.view(task_id), "requested": requested, "waited_s": waited}


async def _list(backend: Backend, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    return await backend.listing(args.get("session"))


async def _new_session(backend: Backend, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    return await backend.new_session(SessionRequest(args.get("cwd"), args.get("env") or {}))


async def _input(backend: Backend, ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    return await backend.input(args["task_id"], args["text"], bool(args.get("eof", False)))


async def _close_session(backend: Backend, ctx: Context, args: dict[str, Any]
                         ) -> dict[str, Any]:
    return await backend.close_session(args["session"])


HANDLERS: dict[str, Handler] = {
    "run": _run, "output": _output, "input": _input, "signal": _signal, "stop": _stop,
    "list": _list, "new_session": _new_session, "close_session": _close_session,
}
