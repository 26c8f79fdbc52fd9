"""The data sets people have: a folder of PNG images of mixed sizes (a torchvision-style
``ImageFolder``, PIL images and Python int labels) packs into fixed-size records with the
``pack --help`` example as written, and trains through the job (``data=file``) and through an
own loop (``examples/own_loop.py --data``, ``coded_shuffle.PackedDataset``); a set whose items
cannot be made one size stops with one line naming the item."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coded_shuffle.tools.cli import PACK_PHOTOS
from coded_shuffle.tools.records import read_metrics
from tests.helpers import run_job

REPO = Path(__file__).resolve().parent.parent
CLASSES, PER_CLASS = 3, 16


def photos(root: Path, seed: int = 0) -> Path:
    """``root/photos/<class>/<i>.png``: RGB images of 20..40 by 20..40 pixels, a bright
    quarter whose corner is the class."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(CLASSES):
        (root / "photos" / f"class{c}").mkdir(parents=True)
        for i in range(PER_CLASS):
            h, w = (int(v) for v in rng.integers(20, 41, 2))
            pixels = rng.integers(0, 80, (h, w, 3), dtype=np.uint8)
            top, left = (c // 2) * h // 2, (c % 2) * w // 2
            pixels[top : top + h // 2, left : left + w // 2] += 150
            Image.fromarray(pixels).save(root / "photos" / f"class{c}" / f"{i}.png")
    return root / "photos"


def coded_shuffle(command: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "coded-shuffle"
    argv = shlex.split(command)
    return subprocess.run(
        [str(exe), *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.distributed
def test_a_folder_of_images_of_any_size_packs_and_trains_in_the_job_and_an_own_loop(tmp_path):
    photos(tmp_path)
    out = coded_shuffle(PACK_PHOTOS, tmp_path)  # the pack --help example, as written
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"packed runs/photos: N = 38 training records of 3080 bytes", out.stdout)
    packed = tmp_path / "runs" / "photos"
    x = np.load(packed / "X.npy", mmap_mode="r")
    assert x.shape == (38, 3, 32, 32) and x.dtype == np.uint8  # 48 images, a fifth held out
    job = ["data=file", f"data.path={packed}", "model=cnn", "epochs=2", "workers=4"]
    run = run_job([*job, f"hydra.run.dir={tmp_path / 'job'}"], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert all(r["verified"] for r in read_metrics(tmp_path / "job"))
    loop = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "3",
            str(REPO / "examples" / "own_loop.py"),
            "--data",
            str(packed),
            "--classes",
            str(CLASSES),
            "--epochs",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},  # torchrun's logs
    )
    assert loop.returncode == 0, loop.stderr[-2000:]
    epochs = [ln for ln in loop.stdout.splitlines() if ln.startswith("epoch ")]
    assert len(epochs) == 2 and all(ln.endswith("verified True") for ln in epochs), loop.stdout


def test_images_of_mixed_sizes_without_a_transform_stop_in_one_line_naming_the_item(tmp_path):
    photos(tmp_path)
    command = PACK_PHOTOS.replace(re.search(r"'data\.item_transform=[^']*'", PACK_PHOTOS)[0], "")
    out = coded_shuffle(command, tmp_path)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert re.match(
        r"coded-shuffle pack: error: data.dataset: item \d+ has input \(3, \d+, \d+\) "
        r"torch.uint8, item 0 \(3, \d+, \d+\) torch.uint8: every input needs the same shape",
        line,
    ), line
    assert "data.item_transform=" in line
    assert not (tmp_path / "runs" / "photos").exists()


@pytest.mark.parametrize("shape", [(24, 40), (40, 24), (24, 24)])
def test_resize_crop_keeps_the_centre_of_the_longer_side(shape):
    """An image whose shorter side is already ``size`` is only cropped: the centre square of
    its pixels (numpy slicing), channels first."""
    from PIL import Image

    from coded_shuffle_train.datasets import ResizeCrop

    h, w = shape
    pixels = np.random.default_rng(h * w).integers(0, 256, (h, w, 3), dtype=np.uint8)
    top, left = (h - 24) // 2, (w - 24) // 2
    want = pixels[top : top + 24, left : left + 24].transpose(2, 0, 1)
    got = ResizeCrop(24)(Image.fromarray(pixels))
    assert got.dtype == np.uint8 and np.array_equal(got, want)
