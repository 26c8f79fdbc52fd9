"""``python -m coded_shuffle_train.node [torchrun's options] (-m coded_shuffle_train [overrides] |
SCRIPT [args])``: one host's node of the training job or of a script, as ``torchrun`` with the
same arguments runs it (torch's own parser and launch configuration), but with the ranks forked
from the project's fork server (:mod:`coded_shuffle_train.forkserver`) instead of started as
fresh interpreters: a host imports torch once, where ``torchrun`` imports it in its agent and
again in every rank. A script runs as under ``torchrun --run-path`` (torch's own
``run_script_path``: ``runpy`` in the rank's interpreter, as ``__main__``). ``coded-shuffle
cluster`` starts it on every host of fixed nodes (docs/transports.md)."""

from __future__ import annotations

import sys

from . import forkserver

PACKAGE = "coded_shuffle_train"  # the one module a node runs (-m): the training job


def main(argv: list[str]) -> None:
    """Parse ``argv`` as ``torchrun`` does, then launch the ranks on this node from the fork
    server; a failed rank fails the node as it fails ``torchrun`` (torch's error record)."""
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, get_args_parser

    args = get_args_parser().parse_args(argv)
    if args.module and args.training_script != PACKAGE:
        refuse(f"runs -m {PACKAGE} or a script, not -m {args.training_script}")
    if args.no_python:
        refuse("--no-python: a node forks Python ranks (torchrun runs a program)")
    if args.standalone:
        refuse("--standalone: on one machine, coded-shuffle-train is the launcher")
    args.start_method = "forkserver"
    args.run_path = not args.module  # a script: torch's run_script_path in the forked rank
    if args.master_port is None:  # as torchrun's own run() sets it
        args.master_port = 29500
    forkserver.start()  # torch imported, no thread or logging handler yet: fork it from here
    config, entry, entry_args = config_from_args(args)
    if args.module:
        record(elastic_launch(config, rank))(list(args.training_script_args))
    else:
        record(elastic_launch(config, entry))(*entry_args)


def refuse(why: str) -> None:
    print(f"python -m {PACKAGE}.node: error: {why}", file=sys.stderr)
    raise SystemExit(2)


def rank(overrides: list[str]) -> None:
    """One rank, in a process forked from the server (which imported the job): as ``python
    -m coded_shuffle_train [overrides]`` under ``torchrun`` (this process never imports it)."""
    from .entry import torchrun_main

    torchrun_main(overrides)


if __name__ == "__main__":
    forkserver.run_command(lambda: main(sys.argv[1:]))
