"""Host side of the user-mode Linux test tier.

The host's cgroup v2 offers no memory/pids/cpu/io controllers; a user-mode Linux guest
(``tests/vm/run-in-vm``, kernel 6.1 booted with ``cgroup_no_v1=all``) has all of them. The tests
that need controllers live in ``tests/guest/guest_*.py``: that name keeps a plain ``pytest`` on
the host from collecting them. Here one module-scoped fixture boots the guest once and runs
pytest on ``tests/guest`` inside it; each guest test then shows up as its own host test
(``test_guest[guest_x.py::test_y]``) that passes, fails (with the guest's failure text) or
skips as its guest counterpart did. The guest test ids are listed at collection time by
parsing the guest files with ``ast``, so collecting costs no boot.

Skips (never failures) when the tier cannot run here: ``CORRAL_SKIP_VM=1``, user-mode-linux
missing and not installable, or a guest that does not boot. A guest that boots and then dies,
hangs past the timeout, or whose pytest errors out fails every test here.

Env: CORRAL_SKIP_VM=1 (skip the tier), CORRAL_VM_TIMEOUT (seconds for the whole guest run,
default 300; a normal run takes ~10-20 s), RUN_IN_VM_MEM (guest RAM, default 1G).
"""

from __future__ import annotations

import ast
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import supervisor

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parent.parent
PACKAGE_ROOT = Path(supervisor.__file__).resolve().parent.parent
RUN_IN_VM = REPO / "tests" / "vm" / "run-in-vm"
GUEST_DIR = REPO / "tests" / "guest"
GUEST_FILES = "guest_*.py"
BOOT_MARKER = "corral-vm-tier: guest booted, starting pytest"
# Host paths the guest does not see: it mounts private tmpfs over them.
GUEST_PRIVATE = ("/tmp", "/run", "/var/tmp", "/dev/shm", "/proc", "/sys")
# The host pytest's own settings, which would change what the guest pytest runs.
HOST_PYTEST_ENV = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_XDIST_", "PYTEST_CURRENT_TEST")


def _timeout_s() -> int:
    return int(os.environ.get("CORRAL_VM_TIMEOUT", "300"))


def _guest_module(path: Path) -> str:
    """The dotted name pytest's junit XML uses as classname for tests in ``path``."""
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def guest_test_ids() -> list[str]:
    """``guest_x.py::test_y`` / ``guest_x.py::TestZ::test_y`` for every guest test, via ast."""
    ids: list[str] = []
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for path in sorted(GUEST_DIR.glob(GUEST_FILES)):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in tree.body:
            if isinstance(node, funcs) and node.name.startswith("test"):
                ids.append(f"{path.name}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                for sub in node.body:
                    if isinstance(sub, funcs) and sub.name.startswith("test"):
                        ids.append(f"{path.name}::{node.name}::{sub.name}")
    return ids


@dataclass
class CaseResult:
    outcome: str  # "passed", "failed", "skipped"
    text: str = ""


@dataclass
class GuestRun:
    returncode: int
    output: str = field(repr=False)
    stderr: str = field(repr=False)
    boot_s: float | None
    total_s: float
    cases: dict[tuple[str, str], list[CaseResult]] = field(default_factory=dict, repr=False)
    junit_error: str | None = None

    def tail(self, lines: int = 60) -> str:
        out = "\n".join(self.output.splitlines()[-lines:])
        err = "\n".join(self.stderr.splitlines()[-20:])
        return f"--- guest output (last {lines} lines) ---\n{out}\n--- run-in-vm stderr ---\n{err}"


def _parse_junit(path: Path) -> dict[tuple[str, str], list[CaseResult]]:
    cases: dict[tuple[str, str], list[CaseResult]] = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        key = (tc.get("classname", ""), tc.get("name", ""))
        outcome, text = "passed", ""
        for child in tc:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                text += f"[{key[1]}: {child.tag}] {child.get('message', '')}\n{child.text or ''}\n"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
                text += child.get("message", "")
        for child in tc:
            if child.tag in ("system-out", "system-err") and outcome == "failed":
                captured = (child.text or "").strip()
                if any(ln.strip() and not ln.startswith("---") for ln in captured.splitlines()):
                    text += f"{captured}\n"
        cases.setdefault(key, []).append(CaseResult(outcome, text))
    return cases


def _skip_reason_from(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if "user-mode-linux is not installed" in line:
            detail = " | ".join(lines[i + 1 : i + 4])
            return line.removeprefix("run-in-vm: ") + (f" {detail}" if detail else "")
    log = " | ".join(lines[-6:])
    return f"linux.uml could not boot the guest (run-in-vm exit 125): {log}"


def _term_when_parent_dies() -> None:
    """In the child: SIGTERM it if this pytest dies (even by SIGKILL), so that run-in-vm's
    trap stops the guest and removes its scratch directory instead of running on."""
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def _run_guest() -> GuestRun:
    # The guest runs this very interpreter (not a pyenv shim: ~5 s per start in the guest),
    # through the host's / that it sees read-only, less the directories it mounts over.
    exe = Path(os.path.realpath(sys.executable))
    for needed in (exe, Path(sys.executable), PACKAGE_ROOT):
        for prefix in GUEST_PRIVATE:
            if needed.is_relative_to(prefix) and not needed.is_relative_to(REPO):
                pytest.skip(f"{needed} (the interpreter, its venv or corral's package) is "
                            f"under {prefix}, which the guest mounts privately: install corral "
                            f"elsewhere to run this tier")

    workdir = Path(tempfile.mkdtemp(prefix=".vm-tier-", dir=REPO))
    try:
        junit = workdir / "guest-junit.xml"
        guest_cmd = [
            sys.executable, "-P", "-m", "pytest",  # -P: not the cwd (the repo) first
            "-p", "no:cacheprovider",
            "--import-mode=prepend",
            "--continue-on-collection-errors",
            "--color=no",
            "-o", f"python_files={GUEST_FILES}",
            "-o", "junit_logging=all",
            "--rootdir", str(REPO),
            "--confcutdir", str(GUEST_DIR),   # the host's tests/conftest.py stays on the host
            "-q", "-rA",
            f"--junitxml={junit}",
            str(GUEST_DIR.relative_to(REPO)),
        ]  # fmt: skip
        cmd = [
            str(RUN_IN_VM),
            "bash",
            "-c",
            f'echo "{BOOT_MARKER}"; exec "$@"',
            "guest",
            *guest_cmd,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(HOST_PYTEST_ENV)}
        env |= {
            "CORRAL_IN_VM": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            # where this interpreter found corral: the repo (editable) or site-packages
            "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT),
                                                        os.environ.get("PYTHONPATH")])),
            "RUN_IN_VM_TIMEOUT": str(_timeout_s()),
        }
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=_term_when_parent_dies,
        )  # fmt: skip
        stderr_chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()))  # type: ignore[union-attr]
        reader.start()
        # run-in-vm kills the guest itself after RUN_IN_VM_TIMEOUT; this is the backstop.
        backstop = threading.Timer(_timeout_s() + 60, lambda: proc.send_signal(signal.SIGTERM))
        backstop.start()
        boot_s = None
        lines: list[str] = []
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if boot_s is None and line == BOOT_MARKER:
                    boot_s = time.monotonic() - start
                    continue
                lines.append(line)
            returncode = proc.wait()
        finally:
            backstop.cancel()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # run-in-vm's trap stops the guest
                proc.wait()
            reader.join()
        run = GuestRun(
            returncode=returncode,
            output="\n".join(lines),
            stderr=b"".join(stderr_chunks).decode("utf-8", "replace"),
            boot_s=boot_s,
            total_s=time.monotonic() - start,
        )
        if returncode == 125 and boot_s is None:
            pytest.skip(_skip_reason_from(run.stderr))
        if junit.exists():
            try:
                run.cases = _parse_junit(junit)
            except ET.ParseError as exc:
                run.junit_error = f"cannot parse the guest's junit XML: {exc}"
        else:
            run.junit_error = "the guest wrote no junit XML"
        return run
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def guest_run() -> GuestRun:
    """Boots the guest once and runs every guest test in it."""
    if os.environ.get("CORRAL_SKIP_VM") == "1":
        pytest.skip("CORRAL_SKIP_VM=1 is set")
    return _run_guest()


def _results_for(run: GuestRun, guest_id: str) -> list[CaseResult]:
    file, *rest = guest_id.split("::")
    module = _guest_module(GUEST_DIR / file)
    classname = ".".join([module, *rest[:-1]])
    func = rest[-1]
    found: list[CaseResult] = []
    for (cls, name), results in run.cases.items():
        same_test = cls == classname and (name == func or name.startswith(func + "["))
        module_error = cls == "" and name == module  # the guest module failed to collect
        if same_test or module_error:
            found += results
    return found


def _check_run(run: GuestRun) -> None:
    if run.returncode == 125:
        pytest.fail(
            "the guest booted but reported no exit status (it died or timed out)\n" + run.tail(),
            pytrace=False,
        )
    if run.returncode not in (0, 1):
        pytest.fail(f"guest pytest exited {run.returncode}\n{run.tail()}", pytrace=False)
    if run.junit_error:
        pytest.fail(f"{run.junit_error}\n{run.tail()}", pytrace=False)


GUEST_IDS = guest_test_ids()


@pytest.mark.parametrize("guest_id", GUEST_IDS)
def test_guest(guest_run: GuestRun, guest_id: str) -> None:
    """One host test per guest test: passes, fails or skips as it did in the guest."""
    _check_run(guest_run)
    results = _results_for(guest_run, guest_id)
    if not results:
        pytest.fail(f"{guest_id} did not run in the guest\n{guest_run.tail()}", pytrace=False)
    failed = [r.text for r in results if r.outcome == "failed"]
    if failed:
        pytest.fail(f"{guest_id} failed in the guest:\n" + "\n".join(failed), pytrace=False)
    if all(r.outcome == "skipped" for r in results):
        pytest.skip(f"skipped in the guest: {results[0].text}")


def test_guest_run_is_complete(guest_run: GuestRun) -> None:
    """Guest pytest ran cleanly, and ran exactly the tests the host listed (no strays)."""
    print(
        f"guest boot (until the job started): {guest_run.boot_s or 0:.1f} s; "
        f"whole guest run: {guest_run.total_s:.1f} s; guest pytest exit {guest_run.returncode}"
    )
    _check_run(guest_run)
    known = {
        (".".join([_guest_module(GUEST_DIR / f), *rest[:-1]]), rest[-1])
        for f, *rest in (gid.split("::") for gid in GUEST_IDS)
    }
    modules = {_guest_module(path) for path in GUEST_DIR.glob(GUEST_FILES)}
    strays = sorted(
        f"{cls}::{name}"
        for cls, name in guest_run.cases
        if (cls, name.split("[", 1)[0]) not in known and not (cls == "" and name in modules)
    )
    if strays:
        pytest.fail(f"guest tests the host did not list (not plain top-level tests?): {strays}")
    if not guest_run.cases:
        pytest.fail(f"no guest test ran\n{guest_run.tail()}", pytrace=False)
