"""Link rates as users write them (``400mbit``, ``1gbit``, ``50mbps``), in ``tc``'s units."""

from __future__ import annotations

import re

from coded_shuffle.errors import UsageError

# tc(8): "bit" units are bits per second, "bps" units are *bytes* per second
_UNITS = {
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
    "tbit": 10**12,
    "bps": 8,
    "kbps": 8 * 10**3,
    "mbps": 8 * 10**6,
    "gbps": 8 * 10**9,
}


def parse_rate(text: object, what: str = "rate") -> int:
    """Bits per second of ``text`` (e.g. ``400mbit``); :class:`UsageError` if it cannot be read."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise UsageError(
            f"{what} {str(text)!r} cannot be parsed; write a number and one of "
            f"{', '.join(_UNITS)} (tc's units: 400mbit = 400 Mbit/s, 50mbps = 50 MB/s)"
        )
    bits = round(float(m.group(1)) * _UNITS[unit])
    if bits < 8000:
        raise UsageError(f"{what} {str(text)!r} is below 8kbit")
    return bits


def format_rate(bits: float) -> str:
    """``400mbit`` style, as tc prints it."""
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits >= scale:
            return f"{bits / scale:g}{unit}"
    return f"{bits:g}bit"
