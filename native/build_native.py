"""cffi out-of-line (API mode) build of corral's native helper into ``supervisor._native``.

setuptools runs this through ``cffi_modules`` (see setup.py).  It imports nothing of corral's.
The declarations come from corral_native.h itself, so the header is the one place they live:
cffi's cdef parser takes the integer #defines and the C declarations, not the include guard.
"""

from __future__ import annotations

import pathlib
import re

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent
_INT_DEFINE = re.compile(r"#define CORRAL_\w+\s+\d+")


def _cdef_from_header(text: str) -> str:
    keep = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and not _INT_DEFINE.match(stripped):
            continue  # include guard and the like
        keep.append(line)
    return "\n".join(keep)


ffibuilder = FFI()
ffibuilder.cdef(_cdef_from_header((HERE / "corral_native.h").read_text()))
ffibuilder.set_source(
    "supervisor._native",
    '#include "corral_native.h"',
    sources=[str((HERE / "corral_native.c").relative_to(HERE.parent))],
    include_dirs=[str(HERE.relative_to(HERE.parent))],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

if __name__ == "__main__":
    # Developers: rebuild the module in place without pip.  Compiled in a scratch directory and
    # moved over the old one with rename(2), so that processes still running the old module
    # (other test runs) keep their mapping instead of crashing on a rewritten file.
    import os
    import shutil
    import tempfile

    os.chdir(HERE.parent)
    with tempfile.TemporaryDirectory(prefix="corral-native-") as tmp:
        shutil.copytree(HERE, pathlib.Path(tmp) / HERE.name)  # cffi builds from inside tmp
        built = pathlib.Path(ffibuilder.compile(tmpdir=tmp, verbose=False))
        target = HERE.parent / "supervisor" / "_native.abi3.so"
        staged = target.with_suffix(".so.new")
        shutil.copy2(built, staged)
        os.replace(staged, target)
    print(f"rebuilt {target}")
