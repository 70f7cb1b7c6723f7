"""Build the keeper (native/corral_keeper.c) into ``supervisor/corral-keeper``, beside the
extension module ``supervisor._native``.

setup.py's ``build_ext`` calls :func:`build` with its own compiler once the cffi extension is
built, for ``pip install .``, ``pip install -e .`` and wheels alike.  It imports nothing of
corral's.  Developers rebuild the executable in place without pip::

    python native/build_keeper.py

The new executable is linked under a temporary name in the destination directory and renamed
over the old one (rename(2)), so a keeper that is running the old file keeps running it, and a
supervisor starting one meanwhile finds either the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from typing import Any

import setuptools  # noqa: F401  (puts its own distutils in place: Python 3.12 has none)

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / "corral_keeper.c"
KEEPER = "corral-keeper"
CFLAGS = ["-O2", "-Wall", "-Wextra"]


def build(compiler: Any, dest_dir: str | os.PathLike[str], build_temp: str) -> pathlib.Path:
    """Compile and link the keeper with ``compiler`` (a distutils ``CCompiler``, customized)
    into ``dest_dir/corral-keeper``, mode 0755, atomically; returns its path."""
    objects = compiler.compile([str(SOURCE)], output_dir=build_temp, extra_postargs=CFLAGS)
    return link(compiler, objects, dest_dir, KEEPER)


def link(compiler: Any, objects: list[str], dest_dir: str | os.PathLike[str],
         name: str) -> pathlib.Path:
    """Link ``objects`` into the executable ``dest_dir/name``, mode 0755, atomically (a
    temporary name there, then renamed over an old one); returns its path.  (The launcher's
    build uses it too.)"""
    dest = pathlib.Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    staged = f".{name}.{os.getpid()}.tmp"
    try:
        compiler.link_executable(objects, staged, output_dir=str(dest))
        os.chmod(dest / staged, 0o755)
        os.replace(dest / staged, dest / name)
    finally:
        if (dest / staged).exists():
            os.unlink(dest / staged)
    return dest / name


def install(built: pathlib.Path, dest_dir: str | os.PathLike[str]) -> pathlib.Path:
    """Copy the executable ``built`` into ``dest_dir`` atomically (copy to a temporary name
    there, then rename), mode 0755; returns the new path."""
    dest = pathlib.Path(dest_dir) / KEEPER
    if dest.resolve() == built.resolve():
        return dest
    staged = dest.with_name(f".{KEEPER}.{os.getpid()}.tmp")
    try:
        staged.write_bytes(built.read_bytes())
        os.chmod(staged, 0o755)
        os.replace(staged, dest)
    finally:
        if staged.exists():
            staged.unlink()
    return dest


def default_compiler() -> Any:
    """The compiler distutils would use for an extension of this Python (its CC and flags)."""
    from distutils.ccompiler import new_compiler
    from distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    return compiler


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="corral-keeper-") as tmp:
        path = build(default_compiler(), HERE.parent / "supervisor", tmp)
    print(f"rebuilt {path}")
