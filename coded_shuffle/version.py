"""The package's version: its one home (``pyproject.toml`` reads it; ``coded-shuffle --version``
prints it)."""

__version__ = "0.2.0"
