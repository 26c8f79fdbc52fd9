"""``coded-shuffle pack OUT_DIR -- DATA_OVERRIDE...``: a packed data set
(:mod:`coded_shuffle.codec.packed`)
written from any data source the job takes, in blocks, with progress on stderr and bounded
memory; ``data=file data.path=OUT_DIR`` then trains on the same records.

What is written is what the job's master would hold: the training split (not trimmed to the
workers: the job trims) and the test split, the array sources' float32 features standardised
with the training statistics, a ``data=dataset`` source's items in their own dtypes. The seed
is the job's ``seed=`` (it draws the synthetic points and a held-out split).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coded_shuffle.errors import UsageError

from . import data
from .compose import check_group_overrides, compose_argv, config_error_line, fail
from .datasets import DatasetSource, instantiate_node, model_shape
from .sources import File, Synthetic
from .standardise import block_stats

PROG = "coded-shuffle pack"
BLOCK_BYTES = 64 << 20  # rows generated, standardised and written at a time


class Progress:
    """``pack: X.npy 1,234 of 5,678 records (21%)`` on stderr, at most once a second."""

    def __init__(self, name: str) -> None:
        self.name, self.last = name, 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < 1.0:
            return
        self.last = now
        share = 100 * done / total if total else 100
        print(f"pack: {self.name} {done:,} of {total:,} records ({share:.0f}%)", file=sys.stderr)


def _array(out: Path, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A new ``OUT/name.npy``, memory-mapped for writing (``dtype``: NumPy's or torch's)."""
    if isinstance(dtype, torch.dtype):
        try:
            dtype = torch.empty((), dtype=dtype).numpy().dtype
        except TypeError:
            raise UsageError(
                f"{name}: {dtype} has no NumPy dtype, so no .npy file holds it"
            ) from None
    return np.lib.format.open_memmap(out / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)


def _rows_per_block(row_bytes: int) -> int:
    return max(1, BLOCK_BYTES // max(row_bytes, 1))


def pack_synthetic(source: Synthetic, seed: int, out: Path) -> None:
    """The synthetic points, drawn a block at a time (the training statistics from two
    draws of the training points, then the points drawn again, standardised and written):
    the same bits as ``data=synthetic``, which draws them once, in memory."""
    n, n_test, d = source.points, source.test_points, source.features
    rows = _rows_per_block(8 * d)

    def train_blocks() -> Iterator[np.ndarray]:
        at = 0
        for xs, _ in source.blocks(seed, rows):
            if at >= n:
                return
            yield xs[: n - at]
            at += xs.shape[0]

    mean, std = block_stats(train_blocks) if source.normalise else (0.0, 1.0)
    x, y = _array(out, "X", (n, d), np.float32), _array(out, "y", (n,), np.int32)
    x_test = _array(out, "X_test", (n_test, d), np.float32)
    y_test = _array(out, "y_test", (n_test,), np.int64)  # as data=synthetic holds it
    progress, at = Progress("X.npy"), 0
    for xs, ys in source.blocks(seed, rows):
        if source.normalise:
            xs = (xs - mean) / std
        for a, b in ((at, min(at + len(ys), n)), (max(at, n), at + len(ys))):
            if b > a:
                target_x, target_y, base = (x, y, 0) if a < n else (x_test, y_test, n)
                target_x[a - base : b - base] = xs[a - at : b - at]
                target_y[a - base : b - base] = ys[a - at : b - at]
        at += len(ys)
        progress(at, n + n_test)
    for array in (x, y, x_test, y_test):
        array.flush()


def pack_dataset(source: DatasetSource, seed: int, out: Path) -> None:
    """A ``data=dataset`` source's items, read one by one in the order the job would hold
    them (its held-out split by the seed), each checked as the job checks it."""
    train_set = instantiate_node(source.dataset, "data.dataset")
    n, x0, y0 = source.first_item(train_set, "data.dataset")
    if source.test_dataset:
        test_set = instantiate_node(source.test_dataset, "data.test_dataset")
        n_test, _, _ = source.first_item(test_set, "data.test_dataset")
        parts = [("", train_set, np.arange(n)), ("_test", test_set, np.arange(n_test))]
    else:
        test, train = source.held_out(n, seed)
        parts = [("", train_set, train), ("_test", train_set, test)]
    model_shape(x0[None].clone(), source.input_transform())
    for suffix, dataset, items in parts:
        x = _array(out, f"X{suffix}", (items.size, *x0.shape), x0.dtype)
        y = _array(out, f"y{suffix}", (items.size,), y0.dtype)
        what = "data.dataset" if dataset is train_set else "data.test_dataset"
        xs, ys = torch.from_numpy(x), torch.from_numpy(y)
        source.read_items(dataset, what, items, xs, ys, Progress(f"X{suffix}.npy"))
        x.flush()
        y.flush()


def pack_arrays(source: data.Source, seed: int, out: Path) -> None:
    """An array source held in memory (digits, an .npz or .pt file), as the job holds it."""
    ds = data.arrays_data_set(source, workers=1, seed=seed)
    for suffix, split in (("", ds.train), ("_test", ds.test)):
        for name, column in zip(("X", "y"), split.tensors, strict=True):
            array = column.numpy()
            target = _array(out, f"{name}{suffix}", array.shape, array.dtype)
            step = _rows_per_block(array[:1].nbytes)
            for a in range(0, array.shape[0], step):
                target[a : a + step] = array[a : a + step]
            target.flush()
            Progress(f"{name}{suffix}.npy")(array.shape[0], array.shape[0])


def packer(source: data.Source) -> Callable[[Any, int, Path], None]:
    if isinstance(source, Synthetic):
        return pack_synthetic
    if isinstance(source, DatasetSource):
        return pack_dataset
    if isinstance(source, File) and source.directory:
        raise UsageError(f"data.path {source.path!r} is a packed directory already")
    return pack_arrays


def pack(out: Path, overrides: list[str]) -> str:
    """Writes ``out`` from the data source that ``overrides`` configure; the summary line."""
    check_group_overrides(overrides)
    try:
        cfg, _ = compose_argv(overrides)
    except UsageError:
        raise
    except Exception as exc:  # Hydra's and OmegaConf's composition errors
        raise UsageError(config_error_line(exc)) from None
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not an empty directory: choose another OUT_DIR")
    source = data.source_of(cfg.data)
    write = packer(source)
    partial = out.with_name(f".{out.name}.packing")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        write(source, int(cfg.seed), partial)
        if out.exists():
            out.rmdir()
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return summary(out)


def summary(out: Path) -> str:
    """``N``, the record bytes and the size on disk of a packed directory."""
    from coded_shuffle.codec.packed import Packed

    packed = Packed.open(out)
    record = packed.x[:1].nbytes + packed.y.itemsize
    size = sum(f.stat().st_size for f in out.glob("*.npy"))
    test = 0 if packed.x_test is None else packed.x_test.shape[0]
    return (
        f"packed {out}: N = {packed.x.shape[0]:,} training records of {record} bytes "
        f"(X {packed.x.dtype} {tuple(packed.x.shape[1:])}, y {packed.y.dtype}), {test:,} test "
        f"records; {size / 1e6:,.1f} MB on disk"
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m coded_shuffle_train.pack OUT_DIR [--] DATA_OVERRIDE...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        fail("pack needs OUT_DIR, then -- and the data overrides (e.g. -- data=synthetic)", 2)
    out, rest = Path(args[0]), args[1:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    try:
        print(pack(out, rest), flush=True)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
