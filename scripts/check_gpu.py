"""The job on the CPU and on the GPU, side by side (``device=cpu`` against ``device=cuda``).

    python scripts/check_gpu.py [--epochs 4] [--workers 4]

Runs the default job (digits, MLP) and the ``cnn`` job (digits as ``uint8`` images through
``data=dataset``) once on each device and prints, per epoch, the bytes on the link (the data
plane stays on the host: they must be identical), the test accuracy (close: CUDA's kernels
sum in another order) and the epoch's seconds; then the own-loop example
(``examples/own_loop.py``: ``cs.dataset`` in a ``DataLoader`` with two loader workers and
``pin_memory``, ``cs.ddp``) on each device, its delivery lines compared. Every run prefetches
(the default). Exits non-zero where the bytes differ or the final accuracies are more than
``--tolerance`` apart. On a machine without CUDA it says so and exits with status 2: it has
not been run there. With fewer GPUs than workers the workers share them (the model's
all-reduce then runs over gloo on the GPUs' tensors: NCCL takes one rank per GPU).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from coded_shuffle.tools.records import read_metrics

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
    return read_metrics(run_dir)


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


def own_loop(device: str, args: argparse.Namespace) -> tuple[list[str], float]:
    """The own-loop example's delivery lines (the master's) and its wall seconds."""
    script = Path(__file__).resolve().parent.parent / "examples" / "own_loop.py"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(args.workers + 1),
        str(script),
        "--device",
        device,
        "--epochs",
        str(args.epochs),
        "--num-workers",
        "2",
    ]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"check_gpu.py: error: {' '.join(cmd)}:\n{out.stderr[-2000:]}")
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("epoch ")]
    return lines, time.perf_counter() - t0


def compare_loops(args: argparse.Namespace) -> bool:
    """The own loop on both devices: the same delivery lines (bytes, bound, verified)."""
    (cpu, cpu_s), (gpu, gpu_s) = own_loop("cpu", args), own_loop("cuda", args)
    print(f"\nown loop (2 loader workers, pin_memory): {cpu_s:.1f} s cpu / {gpu_s:.1f} s cuda")
    for line in gpu:
        print(f"  {line}")
    same = cpu == gpu and all(ln.endswith("verified True") for ln in gpu)
    print(f"  delivery lines identical and verified: {same}")
    return same


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
    ok &= compare_loops(args)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
