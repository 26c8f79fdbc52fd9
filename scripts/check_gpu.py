"""The job on the CPU and on the GPU, side by side (``device=cpu`` against ``device=cuda``).

    python scripts/check_gpu.py [--epochs 4] [--workers 4]

Runs the default job (digits, MLP) and the ``cnn`` job (digits as ``uint8`` images through
``data=dataset``) once on each device and prints, per epoch, the bytes on the link (the data
plane stays on the host: they must be identical), the test accuracy (close: CUDA's kernels
sum in another order) and the epoch's seconds. Exits non-zero where the bytes differ or the
final accuracies are more than ``--tolerance`` apart. On a machine without CUDA it says so and
exits with status 2: it has not been run there.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

JOBS = {
    "default": [],
    "cnn": ["data=dataset", "model=cnn"],
}


def run(job: list[str], device: str, args: argparse.Namespace, where: Path) -> list[dict]:
    """The job's metrics on ``device``."""
    run_dir = where / device
    cmd = [
        sys.executable,
        "-m",
        "coded_shuffle_train.launch",
        *job,
        f"device={device}",
        f"epochs={args.epochs}",
        f"workers={args.workers}",
        f"hydra.run.dir={run_dir}",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"check_gpu.py: error: {' '.join(cmd)}:\n{out.stderr[-2000:]}")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def compare(name: str, cpu: list[dict], gpu: list[dict], tolerance: float) -> bool:
    """Prints the two runs' epochs side by side; True where they agree."""
    print(f"\n{name}: epoch  bytes (cpu = cuda)  accuracy cpu / cuda  seconds cpu / cuda")
    same = True
    for a, b in zip(cpu, gpu, strict=True):
        equal = a["network_bytes"] == b["network_bytes"]
        same &= equal
        print(
            f"  {a['epoch']:>5}  {a['network_bytes']:>12,} {'=' if equal else '!='} "
            f"{b['network_bytes']:<12,}  {a['test_accuracy']:.4f} / {b['test_accuracy']:.4f}"
            f"   {a['epoch_seconds']:7.2f} / {b['epoch_seconds']:7.2f}"
        )
    gap = abs(cpu[-1]["test_accuracy"] - gpu[-1]["test_accuracy"])
    print(f"  final accuracy gap {gap:.4f} (tolerance {tolerance}); bytes identical: {same}")
    return same and gap <= tolerance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tolerance", type=float, default=0.02)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("check_gpu.py: CUDA is not available on this machine: nothing was run")
        raise SystemExit(2)
    print(f"GPU: {torch.cuda.get_device_name(0)} ({torch.cuda.device_count()} devices)")
    ok = True
    for name, job in JOBS.items():
        with tempfile.TemporaryDirectory() as tmp:
            runs = {d: run(job, d, args, Path(tmp)) for d in ("cpu", "cuda")}
        ok &= compare(name, runs["cpu"], runs["cuda"], args.tolerance)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
