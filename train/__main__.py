"""``torchrun ... -m train [hydra overrides]``: the training module on one or several hosts."""

import sys

from .entry import torchrun_main

torchrun_main(sys.argv[1:])
