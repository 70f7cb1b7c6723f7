"""The native builds, which pyproject.toml cannot express; everything else is there.

- ``supervisor._native``: cffi's setuptools integration, the ``cffi_modules`` keyword.
- ``supervisor/corral-keeper``: an executable built from native/corral_keeper.c by
  native/build_keeper.py, with the compiler that built the extension, into the directory the
  extension went to: ``build_lib`` for ``pip install .`` and wheels, and the source tree as well
  for in-place builds (``pip install -e .``, ``build_ext --inplace``).
- the ``corral`` command: an executable built from native/corral_launch.c by
  native/build_launch.py (``build_scripts``), installed where console scripts go.

Files in the source tree are replaced by rename(2), never rewritten in place: other processes of
a shared checkout may be running the old keeper or have the old extension mapped, and a file
truncated under a running mapping kills them (SIGBUS) or fails (ETXTBSY).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import tempfile
from types import ModuleType
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

# (setuptools has no build_scripts of its own: distutils', which importing setuptools provides)
from distutils.command.build_scripts import build_scripts  # isort: skip

HERE = pathlib.Path(__file__).resolve().parent


def _load(name: str) -> ModuleType:
    """native/<name>.py, loaded by path (setup.py's directory need not be on sys.path)."""
    spec = importlib.util.spec_from_file_location(f"corral_{name}",
                                                  HERE / "native" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build_keeper() -> ModuleType:
    return _load("build_keeper")


class BuildLauncher(build_scripts):
    """The ``corral`` command is a small executable (native/corral_launch.c) that blocks the
    job signals and execs this interpreter on supervisor.cli: a Ctrl-C while Python starts is
    then never a traceback.  Built here instead of copying a script."""

    def run(self) -> None:
        import sys
        from distutils.ccompiler import new_compiler
        from distutils.sysconfig import customize_compiler

        compiler = new_compiler()
        customize_compiler(compiler)
        with tempfile.TemporaryDirectory(prefix="corral-launch-") as temp:  # (the object file)
            _load("build_launch").build(compiler, self.build_dir, temp, sys.executable)

    def get_source_files(self) -> list[str]:
        return ["native/corral_launch.c"]


class BuildExtAndKeeper(build_ext):
    """build_ext, then the keeper executable beside ``supervisor._native``."""

    def run(self) -> None:
        super().run()  # (cffi wraps this class: its run generates the C source first)
        keeper = _build_keeper()
        built = keeper.build(self.compiler, self._keeper_dir(inplace=False), self.build_temp)
        if self.inplace:
            keeper.install(built, self._keeper_dir(inplace=True))

    def _keeper_dir(self, *, inplace: bool) -> str:
        """Where supervisor._native goes: in build_lib, or in the source tree."""
        if inplace:
            return str(self.get_finalized_command("build_py").get_package_dir("supervisor"))
        return os.path.join(self.build_lib, "supervisor")

    def _keeper_paths(self) -> tuple[str, str]:
        """(the keeper in build_lib, the keeper in the source tree)."""
        name = "corral-keeper"
        return (os.path.join(self._keeper_dir(inplace=False), name),
                os.path.join(self._keeper_dir(inplace=True), name))

    def get_outputs(self) -> list[str]:
        outputs = list(super().get_outputs())  # in place: the mapping's keys, ours included
        if not self.inplace:
            outputs.append(self._keeper_paths()[0])
        return outputs

    def get_output_mapping(self) -> dict[str, str]:
        mapping = dict(super().get_output_mapping())
        if self.inplace:
            built, in_tree = self._keeper_paths()
            mapping[built] = in_tree
        return mapping

    def copy_file(self, infile: str, outfile: str, *args: Any, **kwargs: Any) -> Any:
        """Copy the extension into the source tree by rename, not by rewriting the file."""
        if not os.path.isfile(outfile) or getattr(self, "dry_run", False):
            return super().copy_file(infile, outfile, *args, **kwargs)
        staged = f"{outfile}.{os.getpid()}.tmp"
        shutil.copy2(infile, staged)
        os.replace(staged, outfile)
        return (outfile, True)


setup(
    cmdclass={"build_ext": BuildExtAndKeeper, "build_scripts": BuildLauncher},
    cffi_modules=["native/build_native.py:ffibuilder"],
    scripts=["native/corral_launch.c"],  # (what build_scripts builds the command from)
)
