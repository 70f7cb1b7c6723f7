"""Mutation testing of corral's core decision logic (mutmut 3), in a copy of the tree.

    .venv/bin/python tests/mutation/run_mutation.py            # HEAD's files, ~20-40 min here
    .venv/bin/python tests/mutation/run_mutation.py --module _units --keep

What is mutated: the stop state (supervisor/_stop.py), the driver's named states
(supervisor/_drive.py), the unit parsers (supervisor/_units.py) and the outcome rules
(supervisor/_ending.py).  The tests that judge each mutant: the unit-parser tests and fuzz,
and tests/mutation/ (fast tests of stop, driver and outcome rules on real processes); mutmut
runs, for each mutant, only the tests that reach the mutated function.

mutmut rewrites the files it mutates (in ``mutants/``, next to its config), and others run
tests from the shared working tree: so everything happens in a fresh copy of the committed
tree (``git archive HEAD``) under ``--workdir``, plus the built native module and keeper,
which git does not hold.  mutmut kills a mutant's test process at its timeout, before the
test's fixtures can remove their cgroups: so the whole run is confined to a cgroup namespace
over a scratch cgroup ``corral-mutation-<hex>`` (as ``python -m benchmarks report`` does),
which is emptied and removed at the end, whatever the mutants left in it.
``--tests-from-tree`` takes tests/ from the working tree instead (to try a test before
committing it).  Prints the score per module and every surviving mutant's diff;
docs/testing.md explains the survivors of the last full run.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.report import cgroup2_mount, run_confined, scratch_cgroup

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
MODULES = {"_stop": "supervisor/_stop.py", "_drive": "supervisor/_drive.py",
           "_units": "supervisor/_units.py", "_ending": "supervisor/_ending.py"}
TESTS = {
    "_units": ["tests/test_units.py", "tests/fuzz/test_fuzz_units.py",
               "tests/mutation/test_mutation_units.py"],
    "_stop": ["tests/mutation"],
    # (hand_over()'s detach is exercised by the core's hand-over test, 2 s)
    "_drive": ["tests/mutation", "tests/core/test_handover.py"],
    "_ending": ["tests/mutation"],
}
BUILT = ["supervisor/_native.abi3.so", "supervisor/corral-keeper"]


def make_copy(workdir: Path, tests_from_tree: bool) -> Path:
    copy = workdir / "tree"
    copy.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(copy)], input=archive, check=True)
    for rel in BUILT:
        shutil.copy2(REPO / rel, copy / rel)
    if tests_from_tree:
        shutil.rmtree(copy / "tests")
        shutil.copytree(REPO / "tests", copy / "tests",
                        ignore=shutil.ignore_patterns("__pycache__", ".vm-tier-*"))
    return copy


def write_config(copy: Path, modules: list[str]) -> None:
    cfg = configparser.ConfigParser()
    tests = sorted({t for m in modules for t in TESTS[m]})
    cfg["mutmut"] = {
        "source_paths": "supervisor",
        "only_mutate": "\n" + "\n".join(MODULES[m] for m in modules),
        "also_copy": "\ncgroupfs\nnative",
        "pytest_add_cli_args_test_selection": "\n" + "\n".join(tests),
        # one failure is enough to kill a mutant; no cache dir in the copy's tests
        "pytest_add_cli_args": "\n-x\n-p\nno:cacheprovider\n-q",
        "use_git_change_detection": "false",
        "timeout_multiplier": "5",
        "timeout_constant": "10",
    }
    with open(copy / "setup.cfg", "w") as f:
        cfg.write(f)


def score(copy: Path, modules: list[str]) -> int:
    subprocess.run([str(VENV_BIN / "mutmut"), "export-cicd-stats"], cwd=copy, check=True,
                   capture_output=True)
    listing = subprocess.run([str(VENV_BIN / "mutmut"), "results", "--all", "true"], cwd=copy,
                             check=True, capture_output=True, text=True).stdout
    by_module: dict[str, dict[str, int]] = {m: {} for m in modules}
    survivors: list[str] = []
    for line in listing.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if not name:
            continue
        module = next((m for m in modules if f"supervisor.{m}." in name), None)
        if module is None:
            continue
        by_module[module][status] = by_module[module].get(status, 0) + 1
        if status not in ("killed", "timeout"):
            survivors.append(name)
    print("\nmutation score (killed or timed out / all mutants):")
    total_k = total = 0
    for m, counts in by_module.items():
        n = sum(counts.values())
        k = counts.get("killed", 0) + counts.get("timeout", 0)
        total_k, total = total_k + k, total + n
        print(f"  {MODULES[m]:26s} {k:4d} / {n:4d} = {100 * k / max(n, 1):5.1f}%   {counts}")
    print(f"  {'all':26s} {total_k:4d} / {total:4d} = {100 * total_k / max(total, 1):5.1f}%")
    print(f"\n{len(survivors)} surviving mutants:")
    for name in survivors:
        shown = subprocess.run([str(VENV_BIN / "mutmut"), "show", name], cwd=copy,
                               capture_output=True, text=True).stdout
        print(f"\n--- {name}\n{shown.strip()}")
    stats = copy / "mutants" / "mutmut-cicd-stats.json"
    if stats.exists():
        print(f"\nmutmut's own counts: {json.loads(stats.read_text())}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", nargs="+", choices=sorted(MODULES), default=sorted(MODULES))
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where the copy goes (default: a new directory under /var/tmp)")
    ap.add_argument("--tests-from-tree", action="store_true",
                    help="tests/ from the working tree, not HEAD")
    ap.add_argument("--max-children", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the copy (to rerun or browse)")
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="corral-mutation-", dir="/var/tmp"))
    copy = make_copy(workdir, args.tests_from_tree)
    write_config(copy, args.module)
    print(f"mutating {', '.join(MODULES[m] for m in args.module)} in {copy}", flush=True)
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               CORRAL_MUTATION_HANG="10")  # a hanging mutant fails its test in 10 s
    mount = cgroup2_mount()
    try:
        with scratch_cgroup(mount, prefix="corral-mutation") as scratch:
            run = run_confined(scratch, mount, [str(VENV_BIN / "mutmut"), "run",
                                                "--max-children", str(args.max_children)],
                               cwd=copy, env=env)
        if run.returncode != 0:
            print(f"mutmut run exited {run.returncode}", file=sys.stderr)
        return score(copy, args.module)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"\nthe copy is kept in {copy} (mutmut browse / show / run there)")


if __name__ == "__main__":
    sys.exit(main())
