"""Build the command's launcher (native/corral_launch.c): the executable installed as ``corral``.

setup.py's ``build_scripts`` calls :func:`build` with the interpreter the package is built for
(pip builds with the interpreter it installs for), which the launcher execs.  Developers rebuild
it by hand into a directory of their choosing::

    python native/build_launch.py DIR
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile
from typing import Any

import setuptools  # noqa: F401  (puts its own distutils in place: Python 3.12 has none)

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / "corral_launch.c"
NAME = "corral"
CFLAGS = ["-O2", "-Wall", "-Wextra"]


def build(compiler: Any, dest_dir: str | os.PathLike[str], build_temp: str,
          python: str) -> pathlib.Path:
    """Compile and link the launcher for ``python`` into ``dest_dir/corral``, mode 0755,
    atomically (rename over an old one); returns its path."""
    literal = '"' + python.replace("\\", "\\\\").replace('"', '\\"') + '"'
    objects = compiler.compile([str(SOURCE)], output_dir=build_temp,
                               macros=[("CORRAL_PYTHON", literal)], extra_postargs=CFLAGS)
    return _build_keeper().link(compiler, objects, dest_dir, NAME)


def _build_keeper() -> Any:
    """native/build_keeper.py, by path (setup.py loads this file by path too: native/ is not
    on sys.path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("corral_build_keeper", HERE / "build_keeper.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    from distutils.ccompiler import new_compiler
    from distutils.sysconfig import customize_compiler

    cc = new_compiler()
    customize_compiler(cc)
    with tempfile.TemporaryDirectory(prefix="corral-launch-") as tmp:
        print(f"built {build(cc, sys.argv[1], tmp, sys.executable)}")
