"""Data sets on disk: ``coded-shuffle pack`` writes what the job's master would hold, and
``data=file data.path=DIR`` reads it memory-mapped, never whole: the same records, bytes for
bytes, as the source packed (so the same parameters), with one-line errors for bad files."""

from __future__ import annotations

import hashlib
import mmap
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from coded_shuffle.codec.buffers import empty_rows
from coded_shuffle.codec.records import RecordLayout, Records
from coded_shuffle.distributed.delivery import Delivery
from coded_shuffle.distributed.epochs import EpochChain
from coded_shuffle.errors import UsageError
from coded_shuffle.math.schemes import get_scheme
from coded_shuffle_train import data, pack, shuffle_sgd, standardise
from tests.helpers import compose, huge_page_advised, in_huge_buffer, mapped_file

REPO = Path(__file__).resolve().parent.parent
TINY = ["data=dataset", "data.dataset._target_=tests.image_sets.TinyImages"]


def test_records_in_memory_are_joined_on_huge_pages_with_the_items_bytes():
    """An in-memory data set of 4 MiB and more is joined into one array on huge pages (the
    encoder reads its rows in random order: docs/codec.md), holding every item's bytes; the
    recycled huge-page buffers never hand it out again while the records hold it."""
    x = torch.randint(0, 256, (20_000, 250), dtype=torch.uint8)
    y = torch.arange(20_000, dtype=torch.int64) % 7
    dataset = torch.utils.data.TensorDataset(x, y)
    records = RecordLayout.of(dataset).pack(dataset, 20_000)
    array = records.array
    assert array is not None and records.shape == (20_000, 258)
    assert huge_page_advised(array.data_ptr()) == hasattr(mmap, "MADV_HUGEPAGE")
    assert torch.equal(array[:, :250], x)
    assert torch.equal(array[:, 250:].contiguous().view(torch.int64).reshape(-1), y)
    other = empty_rows(20_000, 258)  # the codec's next output of that size: another buffer
    assert other.data_ptr() != array.data_ptr() and torch.equal(array[:, :250], x)
    small = RecordLayout.of(dataset).pack(torch.utils.data.TensorDataset(x[:10], y[:10]), 10)
    assert small.array is not None and not in_huge_buffer(small.array.data_ptr())


def records_of(*overrides: str, workers: int = 4):
    cfg = compose(*overrides)
    ds = data.load(cfg.data, workers, int(cfg.seed))
    return RecordLayout.of(ds.train).pack(ds.train, ds.num_points), ds


def same_data(a: tuple, b: tuple) -> None:
    """Two sources give the same training records and the same test split, byte for byte."""
    (ra, da), (rb, db) = a, b
    assert ra.shape == rb.shape and torch.equal(ra.rows(0, ra.shape[0]), rb.rows(0, rb.shape[0]))
    assert da.dropped == db.dropped and len(da.test) == len(db.test)
    for (xa, ya), (xb, yb) in zip(da.test_batches(), db.test_batches(), strict=True):
        assert xa.dtype == xb.dtype and torch.equal(xa, xb) and torch.equal(ya, yb)
    first = da.train.tensors[0][:3]
    assert torch.equal(da.transform(first), db.transform(first))  # what the model reads


def test_a_packed_synthetic_set_is_the_synthetic_sources_records(tmp_path, monkeypatch):
    """Drawn, standardised and written in many blocks: the very bits ``data=synthetic``
    draws and standardises in memory at once."""
    monkeypatch.setattr(pack, "BLOCK_BYTES", 8 * 12 * 37)  # 37 points a block
    monkeypatch.setattr(standardise, "STATS_ROWS", 50)
    knobs = ["data.points=1003", "data.test_points=101", "data.features=12", "seed=5"]
    line = pack.pack(tmp_path / "syn", ["data=synthetic", *knobs])
    assert "N = 1,003 training records of 52 bytes" in line and "101 test records" in line
    packed = records_of("data=file", f"data.path={tmp_path / 'syn'}", "seed=5")
    same_data(records_of("data=synthetic", *knobs), packed)


def test_a_packed_dataset_and_digits_are_their_sources_records(tmp_path):
    """A ``_target_`` Dataset (its items' own dtypes, its held-out split) and the digits
    (float32 features, standardised): packed, then read as ``data=file``."""
    pack.pack(tmp_path / "tiny", TINY)
    same_data(records_of(*TINY), records_of("data=file", f"data.path={tmp_path / 'tiny'}"))
    pack.pack(tmp_path / "digits", ["data=digits"])
    same_data(
        records_of("data=digits"), records_of("data=file", f"data.path={tmp_path / 'digits'}")
    )


def test_a_directory_is_memory_mapped_and_encoded_from_the_mapping(tmp_path):
    """The records handed to the codec are the mapping of X.npy (kept apart from y.npy, never
    joined or loaded), and the symbols encoded from it are those of the records in memory."""
    pack.pack(tmp_path / "d", ["data=synthetic", "data.points=400", "data.features=6"])
    records, ds = records_of("data=file", f"data.path={tmp_path / 'd'}")
    assert records.array is None and len(records.columns) == 2
    assert mapped_file(records.columns[0].ctypes.data) == str(tmp_path / "d" / "X.npy")
    assert mapped_file(records.columns[1].ctypes.data) == str(tmp_path / "d" / "y.npy")
    joined = records.rows(0, records.shape[0])
    assert mapped_file(joined.data_ptr()) is None  # (a copy, for the comparison only)
    tr = next(EpochChain(get_scheme("cycles"), ds.num_points, 4, 1.0, seed=1).transitions(2))
    delivery = Delivery.prepare(tr.plan, records.shape[1])
    streamed = delivery.encoders(records)[0]
    assert type(streamed).__name__ == "GatherEncoder"
    want = delivery.encode(joined)[0]
    assert torch.equal(streamed.rows(0, want.shape[0]), want)
    picked = np.array([3, 1, 2])
    assert torch.equal(streamed.pick(picked).rows(1, 2), want[picked[1:]])


def array_directory(folder: Path, n: int, features: int, seed: int):
    """A directory of ``X.npy`` (``n`` random float32 rows) and ``y.npy`` (int32 labels of
    three classes), without a test split: ``(x, y, folder)``."""
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((n, features)).astype(np.float32), rng.integers(0, 3, n)
    folder.mkdir()
    np.save(folder / "X.npy", x)
    np.save(folder / "y.npy", y.astype(np.int32))
    return x, y, folder


def test_a_directory_without_a_test_split_holds_out_rows_as_a_file_does(tmp_path):
    """No X_test.npy: ``test_fraction`` of the rows held out by the seed, read through an
    index (no copy): the records of the same arrays from an .npz (not standardised)."""
    x, y, folder = array_directory(tmp_path / "dir", 203, 5, seed=3)
    np.savez(tmp_path / "same.npz", X=x, y=y)
    plain = records_of("data=file", f"data.path={tmp_path / 'same.npz'}", "data.normalise=false")
    mapped = records_of("data=file", f"data.path={folder}")
    assert mapped[0].index is not None and mapped[1].dropped == plain[1].dropped
    same_data(plain, mapped)


def test_the_master_evaluates_the_test_split_in_blocks_of_a_fixed_size(tmp_path, monkeypatch):
    """What the evaluation holds does not grow with the test split (a tenth of ``N`` where the
    directory has none): blocks of ``EVAL_BYTES`` of float inputs, every test item once."""
    _, _, folder = array_directory(tmp_path / "dir", 1000, 16, seed=4)
    monkeypatch.setattr(data, "EVAL_BYTES", 4 * 16 * 30)  # 30 items a block
    _, ds = records_of("data=file", f"data.path={folder}")
    blocks = list(ds.test_batches())
    assert len(blocks) == -(-len(ds.test) // 30) > 1
    assert [len(labels) for _, labels in blocks[:-1]] == [30] * (len(blocks) - 1)
    assert sum(len(labels) for _, labels in blocks) == len(ds.test)
    whole = ds.test.take(0, len(ds.test))
    assert torch.equal(torch.cat([inputs for inputs, _ in blocks]), whole[0])


def _bad(folder: Path, arrays: dict[str, np.ndarray]) -> Path:
    folder.mkdir()
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array)
    return folder


@pytest.mark.parametrize(
    ("arrays", "extra", "message"),
    [
        ({"X": np.zeros((4, 2), np.float32)}, [], r"no y\.npy \(a packed data set holds X\.npy"),
        (
            {"X": np.zeros((4, 2)), "y": np.zeros(3, int)},
            [],
            r"needs 4 integer labels .*shape \(3,\)",
        ),
        ({"X": np.zeros((4, 2)), "y": np.zeros(4)}, [], "needs 4 integer labels"),
        ({"X": np.zeros((4, 2)), "y": np.array([0, 1, -1, 0])}, [], "label -1 out of range"),
        (
            {"X": np.zeros((4, 2)), "y": np.zeros(4, int), "X_test": np.zeros((2, 2))},
            [],
            "X_test.npy and y_test.npy go together",
        ),
        (
            {"X": np.zeros((4, 2)), "y": np.zeros(4, int)},
            ["data.normalise=true"],
            "data.normalise=true: a directory's records move as stored",
        ),
    ],
)
def test_a_bad_directory_is_one_usage_error(tmp_path, arrays, extra, message):
    folder = _bad(tmp_path / "bad", arrays)
    with pytest.raises(UsageError, match=message):
        shuffle_sgd.validate(compose("data=file", f"data.path={folder}", "workers=2", *extra))


def test_pack_refuses_in_one_line_and_leaves_nothing(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("mine")
    with pytest.raises(UsageError, match="exists and is not an empty directory"):
        pack.pack(tmp_path / "full", ["data=digits"])
    with pytest.raises(UsageError, match="unknown data 'none'; valid: dataset, digits"):
        pack.pack(tmp_path / "x", ["data=none"])
    with pytest.raises(UsageError, match=r"data\.dataset\._target_='no\.Set' cannot be imported"):
        pack.pack(tmp_path / "x", ["data=dataset", "data.dataset._target_=no.Set"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no partial directory


def test_the_pack_command_prints_the_set_in_one_line(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "coded_shuffle",
            "pack",
            str(tmp_path / "p"),
            "--",
            "data=synthetic",
            "data.points=300",
            "data.features=4",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines() == [
        f"packed {tmp_path / 'p'}: N = 300 training records of 20 bytes (X float32 (4,), y "
        "int32), 1,000 test records; 0.0 MB on disk"
    ]
    assert "pack: X.npy 1,300 of 1,300 records (100%)" in out.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "coded_shuffle", "pack", str(tmp_path / "p"), "--", "data=digits"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO)},
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_records_gathered_into_a_reused_buffer_are_the_fresh_ones():
    """The master reads records into buffers it reuses (no fresh pages per read): the same
    rows as a fresh gather, through an index and across columns, and the same digest; a row
    out of range is refused."""
    rng = np.random.default_rng(6)
    x = rng.integers(0, 256, (300, 40), dtype=np.uint8)
    y = rng.integers(0, 256, (300, 4), dtype=np.uint8)
    index = rng.permutation(300)[:250]
    records = Records([x, y], index)
    points = rng.permutation(250)[:90]
    fresh = np.concatenate([x[index[points]], y[index[points]]], axis=1)
    buffer = np.full((120, 44), 7, dtype=np.uint8)
    assert np.array_equal(records.gather(points, buffer), fresh)
    assert np.array_equal(records.gather(points[:10], buffer), fresh[:10])
    assert np.array_equal(records.gather(points), fresh)
    assert records.digest(points) == hashlib.sha256(fresh.tobytes()).digest()
    out = torch.zeros((5, 44), dtype=torch.uint8)
    assert np.array_equal(records.rows(3, 5, out).numpy(), records.gather(np.arange(3, 8)))
    with pytest.raises(IndexError, match="out of range"):
        Records([x, y]).gather(np.array([300]), buffer)
