"""Red-team fixtures (``sup``, ``scratch``, ``intocg``) and the ``redteam_long`` marker's
skip.  The helpers live in ``rt_util.py``: a module named ``conftest`` is ambiguous when several
test folders are collected in one run, so tests import ``from rt_util import ...``."""

from __future__ import annotations

import pytest
from rt_util import intocg, scratch, sup

__all__ = ["intocg", "scratch", "sup"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selected = config.getoption("-m") or ""
    for item in items:
        if item.get_closest_marker("redteam_long") and "redteam_long" not in selected:
            item.add_marker(pytest.mark.skip(
                reason="longer red-team attack: run with pytest -m redteam_long tests/redteam"))
