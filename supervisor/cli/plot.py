"""``corral run --plot FILE.svg|FILE.png``: the usage series drawn, for a person who would rather
look than read.

matplotlib is an optional extra (``pip install 'corral[plot]'``).  ``run.py`` imports this module
only when ``--plot`` is given, and this module imports matplotlib only to draw.  Whatever can
be known before the run is checked while the command line is read (:func:`check_target`, an
argparse ``type``): a name that is neither .svg nor .png, matplotlib missing, a path that cannot
be written; each is refused, exit 125, before anything runs.  After the run :func:`write_plot`
draws one panel per sampled column on a shared time axis (CPU and IO as rates per sampling
interval, memory and tasks as the samples), marks the stop and the kill, and says what was not
sampled and why.  A failure then is one line on stderr; the exit status stays the task's.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import itertools
import os
import stat
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from .. import TaskResult

__all__ = ["EXTRA", "FORMATS", "check_target", "draw", "write_plot"]

EXTRA = "corral[plot]"
FORMATS = {".svg": "svg", ".png": "png"}
MiB = 1 << 20


def check_target(value: str) -> str:
    """argparse ``type`` of ``--plot``: ``value`` if it can be drawn to; else
    ArgumentTypeError naming the rule and the fix (argparse then exits 125 with it)."""
    if os.path.splitext(value)[1].lower() not in FORMATS:
        raise argparse.ArgumentTypeError(
            f'"{value}": the plot is an SVG or a PNG file; give a name ending in .svg or .png')
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError(
            f"drawing {value} needs matplotlib, which is not installed here; install the "
            f"plot extra: pip install '{EXTRA}'")
    error = _unwritable(value)
    if error is not None:
        raise argparse.ArgumentTypeError(f"{value}: {error}; give a writable path")
    return value


def _unwritable(path: str) -> str | None:
    """Why ``path`` cannot be written (the OS's words), or None.  An existing file is opened
    without truncating it; a new one is created and removed again, so that nothing is left
    if the run never happens."""
    flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO must not block us here
    try:
        os.close(os.open(path, flags))
        return None
    except FileNotFoundError:
        pass
    except OSError as e:
        return e.strerror
    try:
        os.close(os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as e:
        return e.strerror
    os.unlink(path)
    return None


# ---- the panels (pure) -----------------------------------------------------------------------

class Panel(NamedTuple):
    key: str  # the series column; the SVG group id of its line is "corral-<key>"
    title: str
    x: list[float]
    y: list[float]
    steps: bool  # a rate over each interval (drawn as steps), or samples


def _rates(t: list[float], counter: list[float], scale: float) -> tuple[list[float],
                                                                         list[float]]:
    """A counter (0 at the spawn) as its rate over each sampling interval, for steps-post:
    x from 0 to the last sample, y one per interval (the last repeated to close the step)."""
    x = [0.0, *t]
    y = [(c1 - c0) / (t1 - t0) * scale if t1 > t0 else 0.0
         for (t0, c0), (t1, c1) in itertools.pairwise(zip(x, [0.0, *counter], strict=True))]
    return x, [*y, y[-1]]


def _column(series: dict[str, Any], key: str) -> tuple[list[float], list[float]] | None:
    values, t = series.get(key), series.get("t_s") or []
    if not values or not t:
        return None
    n = min(len(values), len(t))  # a column with reads missing: paired with the latest times
    return [float(v) for v in t[len(t) - n:]], [float(v) for v in values[len(values) - n:]]


def panels(r: TaskResult) -> tuple[list[Panel], list[str]]:
    """The panels to draw, and the names of the columns that were not sampled."""
    series = r.usage.series or {}
    out, missing = [], []
    specs = (("cpu_s", "CPU (% of one CPU)", 100.0, "cpu"),
             ("memory_bytes", "Memory (MiB)", 1 / MiB, "memory"),
             ("pids", "Tasks", 1.0, "pids"),
             ("io_bytes", "IO read + written (MiB/s)", 1 / MiB, "io"))
    for key, title, scale, name in specs:
        column = _column(series, key)
        if column is None:
            missing.append(name)
        elif key in ("cpu_s", "io_bytes"):
            out.append(Panel(key, title, *_rates(*column, scale), steps=True))
        else:
            t, values = column
            out.append(Panel(key, title, t, [v * scale for v in values], steps=False))
    return out, missing


def _caption(r: TaskResult, missing: list[str]) -> str:
    """What the figure cannot show: columns not sampled (and why), or no samples at all."""
    if r.usage.series is None:
        return ("no samples: the task ended within its first sampling interval\n"
                "(its figures are in the summary and the JSON record)")
    if not missing:
        return ""
    absent = [m for m in missing if m not in r.containment.controllers]
    why = "no controller for them here" if len(absent) == len(missing) else "not sampled"
    return f"not sampled: {', '.join(missing)} ({why})"


def _memory_note(r: TaskResult) -> str:
    events = {k: v for k, v in (r.usage.memory_events or {}).items()
              if v and k in ("high", "max", "oom", "oom_kill")}
    return ("; memory.events: " + ", ".join(f"{k} {v}" for k, v in events.items())
            if events else "")


# ---- drawing ---------------------------------------------------------------------------------

def _mark_stop(ax: Axes, r: TaskResult) -> None:
    s = r.stop
    if s is None:
        return
    if s.requested_after_s is not None:
        ax.axvline(s.requested_after_s, color="tab:orange", linestyle="--", linewidth=1,
                   label=f"stop requested ({s.reason})")
    if s.killed_after_s is not None:
        ax.axvline(s.killed_after_s, color="tab:red", linestyle=":", linewidth=1.5,
                   label="killed")


def _draw_panel(ax: Axes, p: Panel, r: TaskResult) -> None:
    (line,) = ax.plot(p.x, p.y, drawstyle="steps-post" if p.steps else "default",
                      marker=None if p.steps else ".", linewidth=1.5)
    line.set_gid(f"corral-{p.key}")
    note = _memory_note(r) if p.key == "memory_bytes" else ""
    ax.set_title(p.title + note, loc="left", fontsize="medium")
    ax.set_ylim(bottom=0, top=max(p.y, default=0) * 1.1 or 1)
    ax.grid(True, alpha=0.3)
    _mark_stop(ax, r)


def _heading(r: TaskResult) -> str:
    command = " ".join(r.argv)
    command = command if len(command) <= 70 else command[:69] + "…"
    wall = r.usage.wall_s
    ran = f", {wall:.1f}s" if wall is not None else ""
    return f"{command}\ntask {r.id}: {r.outcome}{ran}"


def draw(r: TaskResult, path: str) -> None:
    """Draw ``r``'s usage series to ``path`` (.svg or .png).  Raises ImportError without
    matplotlib, OSError when the file cannot be written."""
    import matplotlib
    from matplotlib.figure import Figure

    from ..lowlevel import open_output

    shown, missing = panels(r)
    # text stays text in the SVG; every sample stays a vertex (no path simplification);
    # ids and metadata fixed, so one result always gives the same file
    with matplotlib.rc_context({"svg.fonttype": "none", "path.simplify": False,
                                "svg.hashsalt": "corral"}):
        fig = Figure(figsize=(8, 1.4 + 1.9 * len(shown) if shown else 2.4),
                     layout="constrained")
        fig.suptitle(_heading(r), fontsize="medium")
        axes = fig.subplots(max(1, len(shown)), 1, sharex=True, squeeze=False)[:, 0]
        for ax, p in zip(axes, shown, strict=False):
            _draw_panel(ax, p, r)
        if shown and r.stop is not None:
            axes[0].legend(loc="upper right", fontsize="small")
        caption = _caption(r, missing)
        if not shown:
            axes[0].set_axis_off()
            axes[0].text(0.5, 0.5, caption, ha="center", va="center", wrap=True)
        else:
            axes[-1].set_xlabel("seconds after the start")
            if caption:
                fig.supxlabel(caption, fontsize="small", color="dimgray")
        fmt = FORMATS[os.path.splitext(path)[1].lower()]
        metadata = {"Date": None} if fmt == "svg" else {}
        # written through an fd opened without following a link: the task (perhaps another
        # user) ran in the meantime and may have put one where the plot goes
        # (O_NONBLOCK: a FIFO put there would hold us in open(); a plain file only)
        fd = open_output(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, "--plot")
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, f"{path} is not a plain file any more (the task put "
                                        f"something else there); the plot is not written")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=fmt, dpi=100, metadata=metadata)


def write_plot(r: TaskResult, path: str) -> bool:
    """:func:`draw`, with a failure told in one line on stderr (never a traceback: the task has
    run and its status is what counts); True if the file was written."""
    try:
        draw(r, path)
        return True
    except (ImportError, OSError, ValueError, RuntimeError) as e:
        try:
            print(f"corral: --plot {path}: drawing the plot failed: {e}", file=sys.stderr,
                  flush=True)
        except OSError:
            pass
        return False
