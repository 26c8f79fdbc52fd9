"""``python -m coded_shuffle`` runs the ``coded-shuffle`` command."""

from .cli import main

raise SystemExit(main())
