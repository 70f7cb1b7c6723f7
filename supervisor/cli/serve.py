"""``corral serve``: the daemon (HTTP/1.1 + JSON on a Unix socket); see docs/api.md.

Runs until SIGTERM (or SIGINT): then it stops accepting, ends queued tasks unstarted, stops
running ones gracefully (reason ``shutdown``), writes every record and exits 0; a second
SIGTERM kills every task now.  Under systemd: ``Type=notify`` and socket activation work as
they are (systemd/corral.service, systemd/corral.socket).
"""

from __future__ import annotations

import argparse
import grp
import logging
import os
import resource
import sys
from typing import Any

from . import die, missing_cgroup_root

__all__ = ["EARLY", "add_parser", "main"]


def _hold_stop_signals() -> None:
    """SIGTERM, SIGINT and SIGHUP stay blocked until the daemon's receiver is open (it unblocks
    them: supervisor/serve/daemon.py), so that one sent while the daemon starts (its socket
    may already be bound) is a drain, never a death by the default action; the launcher's
    other job signals come back at once."""
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGQUIT, signal.SIGTSTP, signal.SIGWINCH,
                                                signal.SIGCONT))


EARLY = _hold_stop_signals


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the daemon: tasks for clients on a Unix socket",
                       description="Serve the corral API on a Unix socket (docs/api.md).")
    p.add_argument("--socket", metavar="PATH", default=None,
                   help="the socket to bind (default /run/corral/corral.sock; ignored when "
                        "systemd passes one: socket activation)")
    p.add_argument("--state-dir", metavar="DIR", default="/var/lib/corral",
                   help="task records (SQLite) and output files (default /var/lib/corral)")
    p.add_argument("--cgroup-root", metavar="PATH",
                   help="a delegated cgroup v2 directory (default: discovered)")
    p.add_argument("--default-time-limit", metavar="DURATION")
    p.add_argument("--max-time-limit", metavar="DURATION",
                   help="the ceiling: longer time limits are capped, and the result says so")
    p.add_argument("--allow-group", metavar="GROUP",
                   help="only root and members of GROUP may connect (the socket is made "
                        "0660 root:GROUP)")
    p.add_argument("--metrics-group", metavar="GROUP",
                   help="members of GROUP may read GET /metrics (default: root only; its "
                        "counts are of every tenant's tasks)")
    p.add_argument("--max-running", type=int, default=16, metavar="N")
    p.add_argument("--max-running-per-uid", type=int, default=None, metavar="N",
                   help="default: half of --max-running (one uid never holds every slot)")
    p.add_argument("--first-task-slots", type=int, default=None, metavar="N",
                   help="the last N free slots are kept for uids running nothing: a uid's "
                        "second task never takes them (default: a quarter of --max-running, "
                        "at most what --max-running-per-uid leaves over)")
    p.add_argument("--max-queued", type=int, default=10000, metavar="N")
    p.add_argument("--max-queued-per-uid", type=int, default=1000, metavar="N")
    p.add_argument("--max-queued-bytes", default="64M", metavar="SIZE",
                   help="what the queued tasks may count in all (default 64M): each "
                        "twice its request as sent and 2K, its records if it never starts "
                        "(in memory a queued task holds about five times its request)")
    p.add_argument("--max-queued-bytes-per-uid", default="16M", metavar="SIZE")
    p.add_argument("--max-body", default="1M", metavar="SIZE",
                   help="largest request body (default 1M; 413 above)")
    p.add_argument("--output-cap", default="64M", metavar="SIZE",
                   help="output kept on disk per stream and task (default 64M); past it "
                        "the head and tail stay")
    p.add_argument("--max-connections", type=int, default=4096, metavar="N",
                   help="in all; when full, the uid holding the most gives one up")
    p.add_argument("--max-connections-per-uid", type=int, default=256, metavar="N")
    p.add_argument("--max-body-bytes-per-uid", default="8M", metavar="SIZE",
                   help="request bodies one uid's connections may hold at once (default 8M)")
    p.add_argument("--keep-finished", type=int, default=256, metavar="N",
                   help="finished tasks answered from memory (default 256); older ones are "
                        "answered from the records")
    _add_durability(p)
    p.add_argument("--header-timeout", default="10s", metavar="DURATION")
    p.add_argument("--idle-timeout", default="5min", metavar="DURATION")
    p.add_argument("--send-timeout", default="30s", metavar="DURATION",
                   help="a client that reads nothing for this long is disconnected")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    p.add_argument("--loop-nice", type=int, default=LOOP_NICE, metavar="N",
                   help=f"the nice level of the daemon's event loop (default {LOOP_NICE}: "
                        f"ahead of the tenants' own processes; its tasks and threads start at "
                        f"0 whatever it is; 0 leaves it)")


def _add_durability(p: Any) -> None:
    """Retention, completion callbacks and the hand-over (docs/durability.md)."""
    p.add_argument("--retain-age", default="7d", metavar="DURATION",
                   help="finished tasks' records and output are kept this long (default 7d; "
                        "'infinity': no limit)")
    p.add_argument("--retain-count", default="10000", metavar="N",
                   help="at most N finished tasks are kept (default 10000; 'infinity')")
    p.add_argument("--retain-bytes", default="2G", metavar="SIZE",
                   help="finished tasks' records and output files take at most SIZE "
                        "(default 2G; 'infinity')")
    p.add_argument("--on-finish-exec", metavar="PROGRAM",
                   help="run PROGRAM for each finished task (the task's event as JSON on "
                        "stdin; see docs/durability.md)")
    p.add_argument("--on-finish-url", metavar="URL",
                   help="POST each finished task's event to URL over --on-finish-socket")
    p.add_argument("--on-finish-socket", metavar="PATH",
                   help="the Unix socket --on-finish-url is reached through")
    p.add_argument("--drain-timeout", default="60s", metavar="DURATION",
                   help="on shutdown, tasks still running this long after their stop are "
                        "killed, whatever grace they asked for (default 60s: below the unit's "
                        "TimeoutStopSec=90s, so that the daemon writes their records itself)")
    p.add_argument("--no-hand-over", dest="hand_over", action="store_false",
                   help="stop tasks on `systemctl restart` too, instead of handing them to the "
                        "restarted daemon")


def _config(args: argparse.Namespace) -> Any:
    from ..serve.http import HttpLimits
    from ..serve.protocol import DEFAULT_SOCKET, SOCKET_ENV
    from ..serve.scheduler import QueueLimits
    from ..serve.state import Config
    from ..syntax import parse_duration

    for name in ("max_running", "max_queued", "max_queued_per_uid", "max_connections",
                 "max_connections_per_uid", "keep_finished"):
        if getattr(args, name) < 1:
            die(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    import os

    allow_gid = _gid(args.allow_group, "--allow-group")
    metrics_gid = _gid(args.metrics_group, "--metrics-group")
    http = HttpLimits(
        max_body=_size(args.max_body, "--max-body"),
        header_timeout=parse_duration(args.header_timeout, "--header-timeout"),
        idle_timeout=parse_duration(args.idle_timeout, "--idle-timeout"),
        send_timeout=parse_duration(args.send_timeout, "--send-timeout"))
    per_uid = args.max_running_per_uid or max(1, args.max_running // 2)
    if per_uid < 1:
        die(f"--max-running-per-uid must be at least 1, got {per_uid}")
    kept = args.first_task_slots
    if kept is not None and not 0 <= kept < args.max_running:
        die(f"--first-task-slots must be from 0 to one less than --max-running "
            f"({args.max_running - 1}), got {kept}: it is how many of the last free slots "
            f"only a uid running nothing may take")
    queue = QueueLimits(args.max_running, per_uid, args.max_queued, args.max_queued_per_uid,
                        _size(args.max_queued_bytes, "--max-queued-bytes"),
                        _size(args.max_queued_bytes_per_uid, "--max-queued-bytes-per-uid"),
                        kept)
    if (args.on_finish_url is None) != (args.on_finish_socket is None):
        die("--on-finish-url and --on-finish-socket go together: the URL is POSTed over the "
            "socket (as curl --unix-socket SOCKET URL)")
    if args.on_finish_url is not None and not args.on_finish_url.startswith("http://"):
        die(f"--on-finish-url must be http://HOST/PATH, got {args.on_finish_url!r}")
    return Config(
        socket=args.socket or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET,
        state_dir=os.path.abspath(args.state_dir), cgroup_root=args.cgroup_root,
        default_time_limit=args.default_time_limit, max_time_limit=args.max_time_limit,
        allow_gid=allow_gid, socket_mode=0o666 if allow_gid is None else 0o660,
        metrics_gid=metrics_gid,
        queue=queue, http=http, output_cap=_size(args.output_cap, "--output-cap"),
        max_connections=args.max_connections,
        max_connections_per_uid=args.max_connections_per_uid,
        body_bytes_per_uid=_size(args.max_body_bytes_per_uid, "--max-body-bytes-per-uid"),
        keep_finished=args.keep_finished,
        retention=_retention(args), on_finish_exec=args.on_finish_exec,
        on_finish_url=args.on_finish_url, on_finish_socket=args.on_finish_socket,
        hand_over=args.hand_over,
        drain_timeout=parse_duration(args.drain_timeout, "--drain-timeout"))


def _retention(args: argparse.Namespace) -> Any:
    from ..serve.records import Retention
    from ..syntax import parse_duration

    def unlimited(text: str) -> bool:
        return text.strip().lower() in ("infinity", "inf", "none")

    age = None if unlimited(args.retain_age) else parse_duration(args.retain_age,
                                                                   "--retain-age")
    count = None
    if not unlimited(args.retain_count):
        if not (args.retain_count.isascii() and args.retain_count.isdigit()) \
                or int(args.retain_count) < 1:
            die(f"--retain-count must be a whole number >= 1 or 'infinity', got "
                f"{args.retain_count!r}")
        count = int(args.retain_count)
    size = None if unlimited(args.retain_bytes) else _size(args.retain_bytes, "--retain-bytes")
    return Retention(age, count, size)


def _size(text: str, what: str) -> int:
    from ..syntax import parse_size

    size = parse_size(text, what)
    if size == "max":
        die(f"{what} must be a size like 1M, got {text!r}")
    return size


def _gid(name: str | None, option: str) -> int | None:
    if name is None:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        die(f"{option} {name!r}: no such group; create it (groupadd) or name an existing one")


def _raise_nofile() -> int:
    """Connections and tasks are descriptors: use what the hard limit allows.  Returns the
    soft limit as it was (root's tasks start with it again)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft


LOOP_NICE = -5


def _loop_priority(nice: int) -> str | None:
    """This thread (the event loop's: trio runs here) at ``nice``, the threads and processes
    it makes at 0 again (``SCHED_RESET_ON_FORK``: a task never inherits it); why not, or None.
    One tenant's processes spinning (its clients: no cgroup of the daemon's holds them) took
    the CPU from the one thread that answers every tenant: two tenants' connections sending a
    byte at a time from 8 busy threads left the daemon 10% of a CPU, and another tenant's
    median was 145 ms (at -5: 21 ms; an independent attack)."""
    if nice == 0:
        return None
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER | os.SCHED_RESET_ON_FORK, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError as e:
        return (f"the event loop's nice level stays {os.getpriority(os.PRIO_PROCESS, 0)}, not "
                f"{nice}: {e.strerror} (--loop-nice 0 to leave it)")
    return None


def main(args: argparse.Namespace) -> int:
    import trio

    from .. import PlacementError, SupervisorError
    from ..lowlevel import first_leaf
    from ..serve.daemon import serve
    from ..serve.records import RecordsError

    missing = missing_cgroup_root(args.cgroup_root)
    if missing is not None:
        die(missing)
    try:
        config = _config(args)
    except ValueError as e:
        die(str(e))
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="corral serve: %(levelname)s %(name)s: %(message)s")
    config = config._replace(task_nofile_soft=_raise_nofile())
    why_not = _loop_priority(args.loop_nice)
    if why_not is not None:
        logging.getLogger("supervisor.serve.daemon").info("%s", why_not)  # (a container)
    try:
        trio.run(serve, config)
    except* (PlacementError, SupervisorError, RecordsError, OSError, ValueError) as eg:
        die(str(first_leaf(eg)))
    return 0
