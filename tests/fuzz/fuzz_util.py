"""How many examples a fuzz test that runs tasks takes: ``n`` in CI, 20 times that with
``CORRAL_FUZZ=long`` (the profile of tests/fuzz/conftest.py)."""

from __future__ import annotations

import os


def examples(n: int) -> int:
    return n * 20 if os.environ.get("CORRAL_FUZZ") == "long" else n
