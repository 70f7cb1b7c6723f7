"""The distribution really carries the compiled helper and the keeper (some wheels have shipped
without the former)."""

from __future__ import annotations

import os
import pathlib
import shutil
import stat
import subprocess
import sys
import zipfile

import pytest

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
    assert "supervisor/corral-keeper" in names, names
    assert "cgroupfs/__init__.py" in names and "supervisor/__init__.py" in names
    # the command is the launcher (an executable, not a console-script wrapper)
    (command,) = [n for n in names if n.endswith(".data/scripts/corral")]
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(command)[:4] == b"\x7fELF"
        assert stat.S_IMODE(zf.getinfo(command).external_attr >> 16) == 0o755
    _check_wheel_keeper_runs(wheel, tmp_path)


def _check_wheel_keeper_runs(wheel: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The wheel's keeper is an executable (mode 0755) that runs here: without arguments it
    refuses on its ready pipe (stdout) and exits 2."""
    with zipfile.ZipFile(wheel) as zf:
        info = zf.getinfo("supervisor/corral-keeper")
        assert stat.S_IMODE(info.external_attr >> 16) == 0o755
        keeper = pathlib.Path(zf.extract(info, tmp_path / "unpacked"))
    keeper.chmod(0o755)  # zipfile drops modes on extraction; pip restores them from the entry
    r = subprocess.run([str(keeper)], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (2, "error: --pid, --pidfd, --root-fd and --root are "
                                           "all required\n")


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


def test_installed_keeper_sits_beside_the_compiled_module() -> None:
    out = subprocess.run(
        [sys.executable, "-I", "-c",
         "import supervisor._native as m, supervisor._keeper as k; print(m.__file__); "
         "print(k.KEEPER_PATH)"],
        cwd="/", capture_output=True, text=True, check=True,
    )
    so_path, keeper = (pathlib.Path(line) for line in out.stdout.splitlines())
    assert keeper.parent == so_path.parent and keeper.name == "corral-keeper"
    assert os.access(keeper, os.X_OK)


def test_keeper_source_compiles_without_warnings(tmp_path: pathlib.Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler (cc or gcc) on PATH to check native/corral_keeper.c")
    r = subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / "k"),
                        str(ROOT / "native" / "corral_keeper.c")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
