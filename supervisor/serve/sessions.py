"""Sessions: a shell's working directory and exported variables, carried from one command to
the next, each command a task of its own (own leaf, limits, stop, record).

A command runs as ``SHELL -c SCRIPT SHELL_NAME COMMAND`` in the session's directory and
environment.  The script runs the command with ``eval`` in that shell, so ``cd`` and
``export`` act as at an interactive prompt, and at the shell's exit (an ``EXIT`` trap, so a
failing command or an ``exit 3`` still reports) writes what it left (``$PWD``, then ``env -0``)
to a pipe the daemon holds the other end of (the task's fd 3: ``TaskSpec.pass_fds``; never a
file: nothing of it is on a disk a tenant could fill).  The command sees that fd 3 too.  The
daemon reads at most :data:`MAX_STATE` bytes of it.  What carries, and when (the task's row
says, as ``carried``):

- a command that ended by itself (``succeeded`` or ``failed``): its directory and its
  exported variables become the session's (a variable it unset is gone; shell functions,
  aliases and unexported variables do not carry: each command is a new shell);
- a command stopped (time limit, stop request, shutdown), killed by a signal, OOM-killed,
  never started, or lost: nothing, and the row says why;
- a background command (``"background": true``): nothing; the session goes on meanwhile;
- a shell that never reported (its command ran ``exec``, replaced the ``EXIT`` trap, or closed
  the fd): nothing, and the row says so.

No trio here: the pipe is read by ``dispatch.py``; the records are ``records.py``'s.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Any, NamedTuple

from .protocol import dumps_value_in_slices, shown
from .rows import names_within

__all__ = ["MAX_STATE", "SCRIPT", "Reported", "Session", "carried_state", "parse_state",
           "session_argv", "unenterable", "weigh"]

MAX_STATE = 1 << 20  # bytes of a command's reported state read (its directory + environment)
# bytes of environment a uid's open sessions keep in the records, all together (each command
# that would carry more carries nothing, and says why): 64 sessions of a MiB each filled a
# small state disk, and nothing counted it
ENV_PER_UID = 4 << 20
# and variables of them (the daemon holds each as Python objects, ~150-250 bytes apiece, two
# or three times over while a command runs): 30,000 small variables a session, within the
# bytes above, took a daemon from 49 to 251 MB for two tenants (an independent attack)
VARS_PER_UID = 32768
MAX_SESSIONS_PER_UID = 64  # open sessions a uid may hold
# characters of variable names a command's ``carried`` lists (set, unset, not carried: the
# rest are counted as ``omitted``): each command's is in every listing of it, and 500 names of
# a thousand characters made one half a MB
CARRIED_NAMES = 2048
MAX_CWD = 4096  # bytes of a directory a command carries (PATH_MAX; a request's cwd: MAX_TEXT)
MAX_VARIABLE = 131072  # bytes of one NAME=VALUE an exec takes, its NUL included (MAX_ARG_STRLEN)
MAGIC = b"corral-session-state 1\0"
END = b"corral-session-end\0"  # (after the environment: env(1) listed it whole)

# The shell's side.  $1 is the command; the positional parameters are empty when it runs, as
# at a prompt.  `command -p env` finds env(1) whatever PATH the command left.
SCRIPT = r"""__corral_command=$1
shift
__corral_report() {
    __corral_status=$?
    trap - EXIT
    { printf 'corral-session-state 1\000%s\000' "$PWD" && command -p env -0 &&
      printf 'corral-session-end\000'; } \
        >&3 2>/dev/null
    exit "$__corral_status"
}
trap __corral_report EXIT
eval "unset __corral_command; $__corral_command"
"""

# set by the shell itself or by us: never carried
NOT_CARRIED = frozenset({"_", "SHLVL", "PWD", "OLDPWD"})

# outcomes after which a command's state carries over (it ended by itself)
CARRIES = frozenset({"succeeded", "failed"})


def session_argv(shell: str, command: str) -> list[str]:
    return [shell, "-c", SCRIPT, os.path.basename(shell) or "sh", command]


class Session:
    """One open (or closed) session, as the daemon holds it."""

    __slots__ = ("closed_at", "created_at", "current", "cwd", "defaults", "env", "gid", "groups",
                 "id", "last_foreground", "running", "shell", "uid", "weighed")

    def __init__(self, session_id: str, uid: int, gid: int, groups: tuple[int, ...], *,
                 shell: str, cwd: str, env: dict[str, str] | None, defaults: dict[str, Any],
                 created_at: float, closed_at: float | None = None) -> None:
        self.id = session_id
        self.uid, self.gid, self.groups = uid, gid, groups
        self.shell = shell
        self.cwd = cwd
        # the whole environment once a command carried one; before: what the opener asked
        # for (the submitter's login-like base is added to it, as for any task)
        self.env = env
        self.defaults = defaults  # time_limit, grace, properties: each command's unless given
        self.created_at, self.closed_at = created_at, closed_at
        self.current: str | None = None  # the foreground command running now (task id)
        self.running: set[str] = set()  # every task of the session not finished yet
        # (at start-up: the seq of its newest command not in the background, recorded)
        self.last_foreground = 0
        # (an environment, and its env_weight: a MiB of it is not walked again on the loop)
        self.weighed: tuple[Mapping[str, str], int] | None = None

    def weigh(self, env: Mapping[str, str] | None) -> int:
        """``env_weight(env)``, kept for the last environment weighed."""
        if env is None:
            return 0
        if self.weighed is None or self.weighed[0] is not env:
            self.weighed = (env, env_weight(env))
        return self.weighed[1]

    def weight(self) -> int:
        """About how many bytes its JSON holds (its environment's, which a tenant chose):
        an answer carrying it is encoded in pieces (``http.json_response``)."""
        return self.weigh(self.env) + env_weight(self.defaults.get("env"))  # (16 KiB at most)

    def to_json(self) -> dict[str, Any]:
        """Its JSON: ``env`` is what its next command starts with (the last one carried,
        else the one it was opened with; the defaults' ``env`` once hid the carried one)."""
        return {"id": self.id, "uid": self.uid, "gid": self.gid,
                "state": "open" if self.closed_at is None else "closed",
                "created_at": self.created_at, "closed_at": self.closed_at,
                "shell": self.shell, "cwd": self.cwd,
                **{k: v for k, v in self.defaults.items() if v is not None},
                "env": self.env if self.env is not None else self.defaults.get("env"),
                "current": self.current, "running": sorted(self.running, key=int)}

    def row(self) -> dict[str, Any]:
        return {"uid": self.uid, "gid": self.gid, "groups": list(self.groups),
                "created_at": self.created_at, "closed_at": self.closed_at,
                "shell": self.shell, "cwd": self.cwd, "env": self.env,
                "defaults": self.defaults}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Session:
        return cls(row["id"], row["uid"], row["gid"], tuple(row.get("groups") or ()),
                   shell=row["shell"], cwd=row["cwd"], env=row.get("env"),
                   defaults=row.get("defaults") or {}, created_at=row["created_at"],
                   closed_at=row.get("closed_at"))


class Reported(NamedTuple):
    """What a command's shell reported: its directory and environment, and the names of the
    variables that cannot carry (not UTF-8: a task's environment is text), shown escaped."""

    cwd: str
    env: dict[str, str]
    skipped: list[str]
    # made with it, where the report is read (``weigh``, off the event loop: a MiB of report
    # is 200,000 variables, and each was walked there three times): env_weight(env), and the
    # names set and unset against the environment the command started with
    weight: int = 0
    changed: list[str] | None = None
    gone: list[str] | None = None


def weigh(data: bytes, truncated: bool, before: Mapping[str, str],
          most: int | None = None) -> Reported | str:
    """:func:`parse_state`, with what its environment weighs and what it changed against
    ``before`` (the environment the command started with); ``most``: the variables its
    session may carry, beside what its uid's other sessions keep."""
    state = parse_state(data, truncated, most)
    if isinstance(state, str):
        return state
    changed = sorted(k for k, v in state.env.items() if before.get(k) != v)
    gone = sorted(before.keys() - state.env.keys())
    return state._replace(weight=env_weight(state.env), changed=changed, gone=gone)


def parse_state(data: bytes, truncated: bool, most: int | None = None) -> Reported | str:
    """What a command's shell reported, or why nothing can be carried from it (``most``:
    more variables than that cannot carry, counted before any is made)."""
    if not data:
        return ("its shell reported no state (the command ran exec, replaced the EXIT trap, "
                "or closed fd 3)")
    # A report the command wrote itself comes before its shell's, which is written at the
    # shell's exit: the last one is the shell's (the two read as one carried the command's
    # directory with the shell's variables; an independent attack).  END then MAGIC never
    # occur in one report: each would be a line of env(1)'s without "=".
    last = data.rfind(END + MAGIC)
    if last >= 0:
        data = data[last + len(END):]
    if truncated:
        return f"its shell's report was over {MAX_STATE} bytes (an environment that large)"
    if not data.startswith(MAGIC):
        return "its shell's report was not one corral wrote (the command wrote to its fd)"
    if not data.endswith(END):
        return ("its shell could not list its environment (env(1) failed: a variable over "
                "the kernel's 128 KiB for one?)")
    cwd_bytes, _, rest = data[len(MAGIC):-len(END)].partition(b"\0")
    try:
        cwd = cwd_bytes.decode()
    except UnicodeDecodeError:
        return "its working directory is not UTF-8"
    if len(cwd_bytes) > MAX_CWD:
        # (the command may write this report itself: a MiB of "directory" went into every
        # later command's request, result and listing, past what a request may say)
        return (f"its working directory is {len(cwd_bytes)} bytes long, more than a "
                f"path may be ({MAX_CWD}, PATH_MAX)")
    if not cwd.startswith("/"):
        cut = cwd if len(cwd) <= 64 else cwd[:61] + "..."
        return f"its working directory {cut!r} is not an absolute path"
    listed = rest.count(b"\0")  # (its variables; of them, NOT_CARRIED's never carry)
    if most is not None and listed - len(NOT_CARRIED) > most:
        # (refused by the uid's bound anyway, once made: 25,000 variables a command, every
        # command, were ~8 ms of the daemon's Python each, beside every tenant's requests;
        # an independent attack)
        return (f"nothing carried over: its shell reported {listed} variables, above "
                f"the {max(most, 0)} your open sessions' environments may still hold of a "
                f"uid's {VARS_PER_UID}; unset what you do not need, or close sessions you are "
                f"done with")
    try:  # (all of it at once, the usual case: a variable at a time is a us each)
        parts = rest.decode().split("\0")
        if max(map(len, parts)) < MAX_VARIABLE // 4:  # (else: one may be too long, below)
            entries = (e.partition("=") for e in parts)
            return Reported(cwd, {k: v for k, eq, v in entries if eq and k
                                  and k not in NOT_CARRIED}, [])
    except UnicodeDecodeError:
        pass
    env: dict[str, str] = {}
    skipped: list[str] = []
    for entry in rest.split(b"\0"):
        name, eq, value = entry.partition(b"=")
        if not eq or not name:
            continue
        if len(entry) >= MAX_VARIABLE:
            # (no exec takes it: every later command of the session failed to start, E2BIG;
            # a shell cannot report one, env(1) fails first: a report written by hand)
            shown = name[:64].decode(errors="backslashreplace")
            skipped.append(shown + "..." * (len(name) > 64))
            continue
        try:
            key, text = name.decode(), value.decode()
        except UnicodeDecodeError:  # (a TaskSpec's environment is text: it cannot carry)
            skipped.append(name.decode(errors="backslashreplace"))
            continue
        if key not in NOT_CARRIED:
            env[key] = text
    return Reported(cwd, env, sorted(skipped))


# what a foreground command carries when its session ran another before it ended (it had been
# handed back still running: at once, or at its exec's wait bound)
DEMOTED = ("the session ran another command before this one ended: it became background work, "
           "nothing carried over")


def carried_state(session: Session, outcome: str, background: bool,
                  state: Reported | str | None) -> dict[str, Any]:
    """What a finished command leaves its session (and the session updated): the ``carried``
    JSON of its row, ``{"cwd", "set", "unset"}`` (the variables it changed, against the
    environment it started with, as :func:`weigh` compared them; and ``"not_carried"``, the
    names of those that are not UTF-8, if any) or ``{"nothing": why}``."""
    if background:
        return {"nothing": "a background command carries nothing over"}
    if outcome not in CARRIES:
        return {"nothing": f"the command ended {outcome}, not by itself: nothing carried over"}
    if state is None:
        return {"nothing": "its shell's report was not read (the command crossed a restart "
                           "of corral serve, or corral failed to follow it)"}
    if isinstance(state, str):
        return {"nothing": state}
    cwd, env, skipped, changed, gone = state.cwd, state.env, state.skipped, state.changed, \
        state.gone
    assert changed is not None and gone is not None, "a report is read by weigh()"
    session.cwd, session.env = cwd, env
    budget = [CARRIED_NAMES]
    carried: dict[str, Any] = {"cwd": cwd, "set": names_within(changed, budget),
                               "unset": names_within(gone, budget)}
    if skipped:  # (each was dropped: the next command starts without it)
        carried["not_carried"] = names_within(skipped, budget)
    omitted = len(changed) + len(gone) + len(skipped) - sum(
        len(v) for k, v in carried.items() if k != "cwd")
    if omitted:
        carried["omitted"] = omitted
    return carried


def unenterable(session: Session, cwd: str | None, error: Mapping[str, Any] | None,
                ) -> dict[str, Any] | None:
    """What a command that failed to start in its session's directory (``cwd``, as it was
    given; ``error``: its result's, as JSON) leaves its session, or None if it did not: a
    directory its owner cannot enter, or one since removed, fails every later command there
    too, and none could carry a way out (an independent attack)."""
    if error is None or error.get("step") != "chdir" or cwd != session.cwd:
        return None
    return {"nothing": f"the session's directory {shown(session.cwd)} cannot be entered "
                       f"({error.get('errno_name')}): nothing carried over; give a command "
                       f"\"cwd\" to run it elsewhere, and the directory it leaves carries"}


def state_pipe() -> tuple[int, int]:
    """(read end, write end) of a command's state pipe: both close-on-exec (the write end is
    given to the task as its fd 3 by ``pass_fds``), the read end non-blocking."""
    r, w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(r, False)
    return r, w


def usable_shell(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111)


def env_weight(env: Mapping[str, str] | None) -> int:
    """How many bytes ``env`` is as JSON, as the records keep it (escapes counted: a tenant's
    environment of emoji was three times what its characters counted, on the disk's ledger)
    and a few for each variable's punctuation."""
    if not env:
        return 0
    # (each variable's NAME and VALUE quoted and escaped, and six: the names' and the values'
    # JSON lists, each a string and its ``, `` (four) more, in a few C calls, not Python's two
    # a variable: 3,000 variables weighed in 0.7 ms, not 1.6)
    return (len(dumps_value_in_slices(list(env))) + len(dumps_value_in_slices(list(env.values())))
            - 2 * len(env))
