"""Link rates: moved to :mod:`coded_shuffle.costs.rates` (torch-free, for ``predict``); the
names stay importable from here."""

from coded_shuffle.costs.rates import format_rate, parse_rate

__all__ = ["format_rate", "parse_rate"]
