"""``torchrun ... -m train [hydra overrides]``: the training module on one or several hosts.

``python -m train --check [overrides]`` only composes and validates the config (exit 2 with
one line when it is invalid); ``coded-shuffle cluster`` runs it before building any host.
"""

import sys

from .entry import check_main, torchrun_main

if sys.argv[1:2] == ["--check"]:
    check_main(sys.argv[2:])
else:
    torchrun_main(sys.argv[1:])
