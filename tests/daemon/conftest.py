"""The daemon tests' fixtures live in daemon_util.py (importable by that unique name).

``crash``: the full-size crash test (100 SIGKILLs); skipped unless selected with
``pytest -m crash tests/daemon``.  Its short version runs by default.
"""

import pytest
from daemon_util import small_disk, start_daemon, users

__all__ = ["small_disk", "start_daemon", "users"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "crash: the full-size crash test of corral serve "
                                       "(100 SIGKILLs); run with pytest -m crash tests/daemon")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selected = config.getoption("-m") or ""
    for item in items:
        if item.get_closest_marker("crash") and "crash" not in selected:
            item.add_marker(pytest.mark.skip(reason="full size: run with pytest -m crash "
                                                    "tests/daemon"))
