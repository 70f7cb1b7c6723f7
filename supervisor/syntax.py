"""The value syntax corral shares with systemd: durations, sizes, the property table and the
resource-limit names.  Public, for the command line, the daemon and any caller that wants to
check a value the way corral will before it sends it (no trio import).

- :func:`parse_duration`, :func:`format_duration`: systemd time spans (``"1h 30min"``).
- :func:`parse_size`: byte sizes (``"512M"``, ``"1.5G"``).
- :func:`parse_properties`: ``Name=value`` strings or a mapping, to a task's limits and
  isolation; :data:`SUPPORTED`: every property name it takes.
- :data:`RLIMITS`: the ``Limit*=`` names and their ``RLIMIT_*`` numbers; :data:`INFINITY`.
- :data:`DEFAULT_GRACE`: the seconds between a task's stop signal and its kill, unless it
  asks for another grace.

A bad value raises :class:`UnitsError` (a ``ValueError``) naming the field, the value, the
rule and the fix.
"""

from __future__ import annotations

from ._isovalues import INFINITY, RLIMITS
from ._properties import SUPPORTED, parse_properties
from ._units import DEFAULT_GRACE, UnitsError, format_duration, parse_duration, parse_size

__all__ = ["DEFAULT_GRACE", "INFINITY", "RLIMITS", "SUPPORTED", "UnitsError",
           "format_duration", "parse_duration", "parse_properties", "parse_size"]
