"""Hypothesis settings for the fuzz tests.

No example database: several engineers share this working tree, and a failing example is kept
in the code as an ``@example`` (a regression case) rather than in a directory of its own.
``CORRAL_FUZZ=ci`` (the default) keeps the run short; ``CORRAL_FUZZ=long`` multiplies the
examples by 20 (``CORRAL_FUZZ=long pytest tests/fuzz``).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", parent=settings.get_profile("ci"), max_examples=2000)
settings.load_profile(os.environ.get("CORRAL_FUZZ", "ci"))
