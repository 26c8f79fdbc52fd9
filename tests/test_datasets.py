"""``data=dataset``: a user's own map-style ``Dataset`` as the job's data. Records keep the
items' dtypes (a record is exactly the item's bytes), ``data.transform`` makes the model's
floats, bad items stop the launcher in one line; real jobs on the tests' image set with the
``cnn`` and on the digits wrapped as a ``Dataset``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from coded_shuffle.codec.records import RecordLayout
from coded_shuffle.errors import UsageError
from coded_shuffle.tools.records import read_metrics
from coded_shuffle_train import data, shuffle_sgd
from coded_shuffle_train.shuffle_sgd import model_inputs
from tests.helpers import compose, run_job
from tests.image_sets import TinyImages

REPO = Path(__file__).resolve().parent.parent
TINY = "data.dataset._target_=tests.image_sets.TinyImages"
TINY_TEST = "data.test_dataset={_target_:tests.image_sets.TinyImages,n:60,seed:1}"


def test_a_record_is_exactly_the_items_bytes():
    cfg = compose("data=dataset", TINY, TINY_TEST, "model=cnn").data
    items = TinyImages()
    ds = data.load(cfg, workers=7, seed=0)
    x_train = ds.train.tensors[0]
    assert x_train.dtype == torch.uint8 and x_train.shape[1:] == (3, 8, 8)
    assert ds.num_points == 238 and ds.dropped == 2  # 240 trimmed to a multiple of 7
    records = RecordLayout.of(ds.train).pack(ds.train, ds.num_points)
    assert records.shape == (238, 3 * 8 * 8 + 8)  # uint8 pixels and an int64 label
    for i in (0, 1, 117, 237):
        image, label = items[i]
        expected = image.numpy().tobytes() + torch.tensor(label).numpy().tobytes()
        assert records.gather(np.array([i]))[0].tobytes() == expected
    info = data.describe(cfg)
    assert (info.train_points, info.point_bytes, info.input_shape) == (240, 200, (3, 8, 8))
    assert info.classes == 4 and ds.test.tensors[0].shape == (60, 3, 8, 8)


def test_the_transform_makes_the_models_floats_on_the_decoded_inputs():
    cfg = compose("data=dataset", TINY, "+data.transform.mean=0.5", "+data.transform.std=0.25")
    ds = data.load(cfg.data, workers=4, seed=0)
    assert len(ds.test) == 48 and ds.num_points == 192  # test_fraction 0.2 held out
    first = ds.train.tensors[0][:5]
    x = model_inputs(data.transform_of(cfg.data), first)
    expected = (first.reshape(5, -1).double() / 255 - 0.5) / 0.25
    assert x.dtype == torch.float32 and torch.allclose(x.double(), expected, atol=1e-6)
    shuffle_sgd.validate(compose("data=dataset", TINY, "model=cnn", "workers=4"))


def test_dict_items_name_their_input_and_label():
    base = ("data=dataset", "++data.dataset={_target_:tests.image_sets.TinyImages,dict_items:true}")
    ds = data.load(compose(*base).data, workers=2, seed=0)
    assert [t.dtype for t in ds.train.tensors] == [torch.uint8, torch.int64]
    extra = "++data.dataset={_target_:tests.image_sets.TinyImages,dict_items:true,extra_key:true}"
    with pytest.raises(UsageError, match=r"input keys \['image', 'mask'\]: set data.input_key"):
        data.describe(compose("data=dataset", extra).data)
    picked = compose("data=dataset", extra, "data.input_key=image").data
    assert data.describe(picked).input_shape == (3, 8, 8)


def test_the_digits_wrapped_as_a_dataset_move_as_uint8():
    info = data.describe(compose("data=dataset").data)
    assert (info.train_points, info.point_bytes, info.input_shape) == (1438, 72, (1, 8, 8))


T = "tests.image_sets.TinyImages"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.dataset._target_=no.such.Set"], "data.dataset._target_='no.such.Set' cannot be"),
        (["data.dataset._target_=tests.image_sets.Nope"], "cannot be imported"),
        ([f"++data.dataset={{_target_:{T},n:-1}}"], f"data.dataset: {T}(...) failed: ValueError"),
        ([f"++data.dataset={{_target_:{T},vary_at:5}}"], "item 5 has input (3, 8, 9) torch.uint8"),
        (
            [f"++data.dataset={{_target_:{T},float_label_at:3}}"],
            "item 3's label 0.5 (float) is not",
        ),
        ([f"++data.dataset={{_target_:{T},n:3}}"], "workers=4 exceeds the 2 training points"),
        ([f"++data.dataset={{_target_:{T},n:0}}"], "data.dataset is empty"),
        ([TINY, "data.transform=null"], "must return a floating-point tensor"),
        ([TINY, f"data.test_dataset={{_target_:{T},side:6}}"], "inputs (3, 6, 6) torch.uint8"),
        (
            [TINY, "++data.transform={_target_:torch.flatten,_partial_:true}"],
            "data.transform must return a floating-point tensor for the model, got torch.uint8",
        ),
        ([TINY, "data.dataset._target_=torch.nn.Linear"], "data.dataset: torch.nn.Linear(...)"),
    ],
)
def test_bad_data_sets_are_one_usage_error_before_any_process(overrides, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        shuffle_sgd.validate(compose("data=dataset", *overrides))


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The job on a data set (``tests.image_sets`` importable by its ranks)."""
    flags = [a for a in args if a == "-m"]  # Hydra's multirun flag before the overrides
    overrides = [a for a in args if a != "-m"]
    command = [*flags, "data=dataset", "model=cnn", *overrides]
    return run_job(command, cwd, timeout=300, env={"PYTHONPATH": str(REPO)})


def test_an_unimportable_dataset_stops_the_command_in_one_line(tmp_path):
    out = _train(["data.dataset._target_=no.such.Set", f"hydra.run.dir={tmp_path}/r"], tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "data.dataset._target_='no.such.Set' cannot be imported" in lines[0]


@pytest.mark.distributed
def test_jobs_on_the_tests_image_set_and_the_digits_verify_every_epoch(tmp_path):
    """The tests' image set with the cnn under two schemes (same parameters), the same set
    packed by ``coded-shuffle pack`` and read memory-mapped (``data=file``: the same
    parameters again, the records being the same bytes), and the digits as a Dataset: every
    epoch verified, a point's bytes are the item's."""
    from coded_shuffle_train.pack import pack

    job = ["workers=3", "epochs=3", "seed=2", "model.channels=4", "optim.batch_size=4"]
    out = _train(
        ["-m", TINY, TINY_TEST, "scheme=uncoded,cycles", *job, f"hydra.sweep.dir={tmp_path}/tiny"],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    out = _train([*job, f"hydra.run.dir={tmp_path}/digits"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    pack(tmp_path / "packed", ["data=dataset", TINY, TINY_TEST])
    packed = ["data=file", f"data.path={tmp_path / 'packed'}", "model=cnn", "scheme=cycles"]
    out = run_job(
        [*packed, *job, f"hydra.run.dir={tmp_path}/file"],
        tmp_path,
        timeout=300,
        env={"PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = {}
    for path in tmp_path.rglob("summary.json"):
        summary = json.loads(path.read_text())
        rows = read_metrics(path.parent)
        assert summary["all_verified"] and all(r["verified"] for r in rows)
        summaries[(summary["data"], summary["point_bytes"], summary["scheme"])] = summary
    assert set(summaries) == {
        ("dataset", 200, "uncoded"),
        ("dataset", 200, "cycles"),
        ("dataset", 72, "cycles"),
        ("file", 200, "cycles"),
    }
    uncoded, coded = summaries["dataset", 200, "uncoded"], summaries["dataset", 200, "cycles"]
    mapped = summaries["file", 200, "cycles"]
    assert uncoded["points"] == coded["points"] == mapped["points"] == 240
    assert uncoded["final_params_sha256"] == coded["final_params_sha256"]
    assert mapped["final_params_sha256"] == coded["final_params_sha256"]
    assert coded["final_test_accuracy"] > 0.5  # 4 classes: the cnn learns the bright corner
    assert summaries["dataset", 72, "cycles"]["points"] == 1437  # 1438 trimmed to a multiple of 3
