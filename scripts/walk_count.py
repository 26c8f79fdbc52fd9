"""How long the walk through one coded epoch is: the library's functions, files and classes
that run on the master (or a worker) while ``CodedShuffle.epoch(2)`` delivers a coded epoch
(docs/architecture.md, "One epoch").

    python scripts/walk_count.py [--scheme cycles] [--transport chain] [--side master]

Starts three ranks on this host (the master and two workers), delivers the placement, then
counts every function of ``coded_shuffle/`` that runs during epoch 2 on the chosen side, on
the calling thread and on every thread started during it, and prints the counts and, with
``--list``, the functions by file. The delivery runs in the foreground (``prefetch=False``).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LIBRARY = str(REPO / "coded_shuffle") + "/"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", default="cycles")
    parser.add_argument("--transport", default="chain")
    parser.add_argument("--side", choices=("master", "worker"), default="master")
    parser.add_argument("--list", action="store_true", help="print the functions by file")
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


class Walk:
    """The library's code objects called while it is on (every thread that starts meanwhile
    too)."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(LIBRARY):
            code = frame.f_code
            self.seen.add((code.co_filename[len(LIBRARY) :], code.co_qualname))

    def __enter__(self) -> Walk:
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def counts(self) -> dict[str, Any]:
        """Functions (not comprehensions, lambdas or module bodies), by file; the classes
        whose methods ran."""
        by_file: dict[str, list[str]] = defaultdict(list)
        for file, qualname in sorted(self.seen):
            if not qualname.rsplit(".", 1)[-1].startswith("<"):
                by_file[file].append(qualname)
        classes = {
            (file, name.split(".")[0])
            for file, names in by_file.items()
            for name in names
            if "." in name and name[:1].isupper()
        }
        return {
            "functions": sum(len(v) for v in by_file.values()),
            "files": len(by_file),
            "classes": len(classes),
            "by_file": dict(by_file),
        }


def rank_main(args: argparse.Namespace) -> None:
    """One rank: the placement, then epoch 2 counted on the chosen side."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import TensorDataset

    from coded_shuffle import CodedShuffle

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.randint(0, 256, (600, 32), dtype=torch.uint8, generator=torch.Generator())
    data = TensorDataset(x) if rank == 0 else None
    with CodedShuffle(
        data, scheme=args.scheme, transport=args.transport, epochs=3, prefetch=False
    ) as cs:
        cs.epoch(1)
        mine = (args.side == "master") == (rank == 0) and rank in (0, 1)
        walk = Walk()
        if mine:
            with walk:
                cs.epoch(2)
        else:
            cs.epoch(2)
        cs.epoch(3)
    dist.destroy_process_group()
    if mine:
        print(json.dumps(walk.counts()))


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.rank_main:
        rank_main(args)
        return 0
    from coded_shuffle.tools.ranks import start_ranks

    script = [__file__, "--rank-main", "--scheme", args.scheme, "--transport", args.transport]
    procs = start_ranks([*script, "--side", args.side], 3, REPO)
    outs = [p.communicate(timeout=300) for p in procs]
    if any(p.returncode for p in procs):
        print(next(err for (_, err), p in zip(outs, procs, strict=True) if p.returncode)[-2000:])
        return 1
    counts = json.loads(next(out for out, _ in outs if out.strip()).strip().splitlines()[-1])
    print(
        f"{args.side}, epoch 2 ({args.scheme} over {args.transport}): {counts['functions']} "
        f"functions of the library in {counts['files']} files, {counts['classes']} classes"
    )
    if args.list:
        for file, names in counts["by_file"].items():
            print(f"  {file}: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
