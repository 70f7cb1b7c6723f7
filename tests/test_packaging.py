"""The distribution really carries the compiled helper (some wheels have shipped without)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_wheel_contains_compiled_module_and_both_packages(tmp_path: pathlib.Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("corral-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.startswith("supervisor/_native") and n.endswith(".so")], names
    assert "cgroupfs/__init__.py" in names and "supervisor/__init__.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "corral = supervisor.cli:main" in text


def test_installed_package_imports_its_compiled_module_outside_the_source_tree() -> None:
    # From / and with -I (no cwd, no user site), only the installed environment can answer.
    out = subprocess.run(
        [sys.executable, "-I", "-c",
         "import supervisor._native as m; print(m.__file__); print(m.lib.corral_spawn)"],
        cwd="/", capture_output=True, text=True, check=True,
    )
    so_path, func = out.stdout.splitlines()
    assert so_path.endswith(".so") and pathlib.Path(so_path).is_file()
    assert "corral_spawn" in func
