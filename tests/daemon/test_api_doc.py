"""docs/api.md's examples, run as printed: every ``sh`` block, in order, in one bash with
``set -euo pipefail``, with curl and jq against a real daemon.  Every verb of the API has
one, so curl works for every verb, as the document says."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
from collections.abc import Callable

import pytest
from daemon_util import RunningDaemon

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "api.md"
VERBS = ("POST http://corral/v1/tasks", "/output", "/wait", "/stop", "/stdin", "/resize",
         "/signal", "v1/tasks?", "/v1/sessions", "/exec", "-X DELETE", "/v1/events",
         "/v1/limits", "/metrics")


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```$", text, re.S | re.M)


def test_every_verb_has_an_example() -> None:
    joined = "\n".join(sh_blocks(DOC.read_text()))
    assert [v for v in VERBS if v not in joined] == []


def test_the_examples_run_as_printed(start_daemon: Callable[..., RunningDaemon],
                                     tmp_path: pathlib.Path) -> None:
    missing = [tool for tool in ("curl", "jq") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"docs/api.md's examples use {' and '.join(missing)}: apt-get install "
                    f"{' '.join(missing)} (the README's test command does)")
    d = start_daemon()
    script = "set -euo pipefail\n" + "\n".join(sh_blocks(DOC.read_text()))
    run = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin", "CORRAL_SOCKET": d.socket})
    out = run.stdout
    assert run.returncode == 0, f"exit {run.returncode}\n{out[-3000:]}\n{run.stderr[-2000:]}"
    assert '"building\\n' in out or "YnVpbGRpbmc" in out  # (the followed output, base64)
    assert "answered at its end" in out
    assert "\n2\n" in out  # wc -l of what was written to its stdin
    assert "50 132" in out  # stty size after the resize
    assert '"signal_name": "SIGINT"' in out and "interrupted, going on" not in run.stderr
    assert "1 /usr" in out  # what the session's first command carried, its second saw
    assert '"subscribed": true' in out or '"subscribed":true' in out
    assert "corral_tasks_running" in out
