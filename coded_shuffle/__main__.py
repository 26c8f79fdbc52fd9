"""``python -m coded_shuffle`` runs the ``coded-shuffle`` command."""

from coded_shuffle.tools.cli import main

raise SystemExit(main())
