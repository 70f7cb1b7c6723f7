"""``python -m supervisor.mcp``: the same as ``corral mcp``."""

import sys

from . import main

raise SystemExit(main(sys.argv[1:]))
