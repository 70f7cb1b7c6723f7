"""``python -m benchmarks report [--size quick|full] [--only NAME...] [--out FILE]``.

Runs every benchmark script in this directory at one size and writes one Markdown table
(benchmark, ours, baseline, ratio, target, met?) under the machine's header; see report.py.
"""

from __future__ import annotations

import sys

USAGE = "usage: python -m benchmarks report [--size quick|full] [--only NAME...] [--out FILE]"


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] != "report":
        print(USAGE, file=sys.stderr)
        return 2
    from benchmarks.report import main as report

    return report(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
