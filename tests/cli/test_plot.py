"""`corral run --plot FILE.svg|FILE.png`: the drawing holds the series (the SVG parsed back),
PNG works, and what cannot work is refused before anything runs (exit 125)."""

from __future__ import annotations

import itertools
import os
import re
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

import cgroupfs
from supervisor import TaskResult
from supervisor._result import (
    Cleanup,
    Containment,
    Outcome,
    StopReason,
    StopRecord,
    StreamOutput,
    Usage,
)
from supervisor.cli.plot import check_target, draw, panels, write_plot

try:
    import matplotlib  # noqa: F401
    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False
# the tests that draw; the refusal of --plot without matplotlib runs either way
needs_matplotlib = pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="the plot extra is not "
                                      "installed: pip install 'corral[plot]'")

CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
SVG = "{http://www.w3.org/2000/svg}"
MiB = 1 << 20
ALL = ("cpu", "io", "memory", "pids")


def make_result(series: dict[str, Any] | None, controllers: tuple[str, ...] = ALL,
                stop: StopRecord | None = None, **usage: Any) -> TaskResult:
    return TaskResult(
        id="5d3f1a-1", argv=("sh", "-c", "work"), outcome=Outcome.SUCCEEDED, exit_code=0,
        signal=None, started=True, cleanup=Cleanup("clean"), stop=stop,
        usage=Usage(wall_s=4.2, cpu_total_s=2.0, series=series, **usage),
        output_stdout=StreamOutput(mode="inherit"), output_stderr=StreamOutput(mode="inherit"),
        containment=Containment("cgroup", controllers=controllers), time_limit=None,
        created_at=0.0, started_at=0.0, ended_at=4.2)


SERIES = {"t_s": [1.0, 2.0, 3.0, 4.0], "cpu_s": [1.0, 1.5, 1.5, 2.0],
          "memory_bytes": [4 * MiB, 12 * MiB, 8 * MiB, 20 * MiB], "pids": [1, 6, 6, 2],
          "io_bytes": [0, 0, 8 * MiB, 8 * MiB]}


def svg_line(root: ET.Element, key: str) -> list[tuple[float, float]]:
    """The vertices of the line drawn for series column ``key``."""
    group = root.find(f".//{SVG}g[@id='corral-{key}']")
    assert group is not None, f"no line for {key}"
    path = group.find(f"{SVG}path")
    assert path is not None
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", path.get("d", ""))]
    return list(zip(numbers[0::2], numbers[1::2], strict=True))


def svg_text(root: ET.Element) -> str:
    return "\n".join("".join(t.itertext()) for t in root.iter(f"{SVG}text"))


def ranks(values: list[float]) -> list[int]:
    return sorted(range(len(values)), key=lambda i: values[i])


@needs_matplotlib
def test_the_svg_holds_every_series(tmp_path: Path) -> None:
    events = {"low": 0, "high": 139, "max": 35, "oom": 1, "oom_kill": 1}
    stop = StopRecord(StopReason.TIME_LIMIT, "killed", 15, 2.5, 2.5, 3.5, "grace_expired", True)
    out = tmp_path / "usage.svg"
    draw(make_result(SERIES, stop=stop, memory_events=events), str(out))
    root = ET.parse(out).getroot()

    memory = svg_line(root, "memory_bytes")
    assert len(memory) == 4  # one vertex per sample: nothing simplified away
    xs, ys = [x for x, _ in memory], [y for _, y in memory]
    assert xs == sorted(xs) and len({round(b - a, 3) for a, b in itertools.pairwise(xs)}) == 1
    # SVG's y grows downwards: the highest sample is the smallest y
    assert ranks([-y for y in ys]) == ranks(SERIES["memory_bytes"])
    pids = svg_line(root, "pids")
    assert ranks([-y for _, y in pids]) == [0, 3, 1, 2]  # 1 < 2 < 6 = 6
    # CPU and IO are rates per interval, drawn as steps: 1, 0.5, 0, 0.5 CPU; IO only in 2..3 s
    cpu_levels = sorted({round(y, 3) for _, y in svg_line(root, "cpu_s")})
    assert len(cpu_levels) == 3  # 0%, 50%, 100%
    io_levels = {round(y, 3) for _, y in svg_line(root, "io_bytes")}
    assert len(io_levels) == 2

    text = svg_text(root)
    for title in ("CPU (% of one CPU)", "Memory (MiB)", "Tasks", "IO read + written (MiB/s)",
                  "memory.events: high 139, max 35, oom 1, oom_kill 1",
                  "stop requested (time_limit)", "killed", "seconds after the start",
                  "task 5d3f1a-1: succeeded, 4.2s"):
        assert title in text, title


@needs_matplotlib
def test_a_series_without_its_controller_is_named_not_drawn(tmp_path: Path) -> None:
    out = tmp_path / "cpu.svg"
    series = {**SERIES, "memory_bytes": None, "pids": None, "io_bytes": None}
    draw(make_result(series, controllers=()), str(out))
    root = ET.parse(out).getroot()
    assert len(svg_line(root, "cpu_s")) > 4
    assert root.find(f".//{SVG}g[@id='corral-memory_bytes']") is None
    assert "not sampled: memory, pids, io (no controller for them here)" in svg_text(root)


@needs_matplotlib
def test_a_task_never_sampled_gets_a_figure_saying_so(tmp_path: Path) -> None:
    out = tmp_path / "short.svg"
    draw(make_result(None), str(out))
    text = svg_text(ET.parse(out).getroot())
    assert "no samples: the task ended within its first sampling interval" in text
    assert panels(make_result(None))[0] == []


@needs_matplotlib
def test_png_is_written(tmp_path: Path) -> None:
    out = tmp_path / "usage.PNG"
    draw(make_result(SERIES), str(out))
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width == 800 and height > 600  # 8 in at 100 dpi; four panels


def test_a_failure_after_the_run_is_one_line(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    gone = tmp_path / "gone"
    assert write_plot(make_result(SERIES), str(gone / "usage.svg")) is False
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"corral: --plot {gone}/usage.svg: ")


@needs_matplotlib
def test_the_check_leaves_nothing_and_keeps_an_existing_file(tmp_path: Path) -> None:
    new = tmp_path / "new.svg"
    assert check_target(str(new)) == str(new) and not new.exists()
    old = tmp_path / "old.png"
    old.write_bytes(b"keep")
    assert check_target(str(old)) == str(old) and old.read_bytes() == b"keep"


# ---- refused before anything runs ------------------------------------------------------------

def refused(tmp_path: Path, plot: str, root: str, **env: str) -> str:
    """Runs ``corral run --plot PLOT -- touch MARKER``; asserts exit 125 and that the command
    never ran; returns stderr."""
    marker = tmp_path / "ran"
    r = subprocess.run([CORRAL, "run", "--cgroup-root", root, "--plot", plot, "--",
                        "touch", str(marker)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **env})
    assert r.returncode == 125, r.stderr
    assert not marker.exists()
    assert r.stderr.count("\n") == 1, r.stderr
    return r.stderr


def test_without_matplotlib_plot_is_refused_naming_the_extra(
        tmp_path: Path, test_cgroup: cgroupfs.Cgroup) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None\n")
    err = refused(tmp_path, str(tmp_path / "u.svg"), test_cgroup.path,
                  PYTHONPATH=os.pathsep.join(filter(None, [str(hide),
                                                           os.environ.get("PYTHONPATH")])))
    assert "needs matplotlib" in err and "pip install 'corral[plot]'" in err
    assert not (tmp_path / "u.svg").exists()


@needs_matplotlib
@pytest.mark.parametrize("case", ["no such directory", "a directory", "not svg or png"])
def test_a_plot_that_cannot_be_written_is_refused_before_the_run(
        tmp_path: Path, test_cgroup: cgroupfs.Cgroup, case: str) -> None:
    plot, words = {
        "no such directory": (tmp_path / "missing" / "u.svg", "No such file or directory"),
        "a directory": (tmp_path / "d.svg", "Is a directory"),
        "not svg or png": (tmp_path / "u.pdf", "give a name ending in .svg or .png"),
    }[case]
    if case == "a directory":
        plot.mkdir()
    err = refused(tmp_path, str(plot), test_cgroup.path)
    assert err.startswith("corral: argument --plot: ") and words in err


# ---- end to end on the host --------------------------------------------------------------------

@needs_matplotlib
def test_corral_run_plot_draws_the_cpu_it_sampled(tmp_path: Path,
                                                  test_cgroup: cgroupfs.Cgroup) -> None:
    out = tmp_path / "run.svg"
    busy = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 2.3: pass\n"
    r = subprocess.run([CORRAL, "run", "--cgroup-root", test_cgroup.path, "--plot", str(out),
                        "--", sys.executable, "-c", busy],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    root = ET.parse(out).getroot()
    assert len(svg_line(root, "cpu_s")) >= 2 * 2 + 1  # two samples at least, as steps
    assert "task " in svg_text(root)


def test_plot_takes_the_next_word_as_its_file_whatever_it_starts_with() -> None:
    from supervisor.cli.run import prepare_argv

    assert prepare_argv(["--plot", "-odd.svg", "--time-limit", "-1s", "--", "true"]) == \
        ["--plot=-odd.svg", "--time-limit=-1s", "--", "true"]
