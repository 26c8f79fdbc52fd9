"""``torchrun ... -m coded_shuffle_train [hydra overrides]``: the training module on one or several
hosts.

``python -m coded_shuffle_train --check [overrides]`` only composes and validates the config (exit 2
with one line when it is invalid); ``coded-shuffle cluster`` runs it before building any host.
``python -m coded_shuffle_train --profile [overrides]`` prints the job's shape and its compute
measured on this machine, as JSON (``coded-shuffle predict --job`` prices the run from it)."""

import sys

from .entry import check_main, profile_main, torchrun_main
from .fast_exit import exit_now

if sys.argv[1:2] == ["--check"]:
    check_main(sys.argv[2:])
elif sys.argv[1:2] == ["--profile"]:
    profile_main(sys.argv[2:])
else:
    torchrun_main(sys.argv[1:])
    exit_now()  # the rank's work is written and its group destroyed: skip torch's teardown
