"""Where the model trains (``device``): the choice, the backend of the workers' model group,
and the one-line errors. What depends on a GPU is decided from a flag, so this runs without
one; the GPU path itself is checked by ``scripts/check_gpu.py`` on a machine that has it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coded_shuffle.errors import UsageError
from coded_shuffle_train import device as dev


@pytest.mark.parametrize(
    ("name", "available", "kind"),
    [
        ("auto", False, "cpu"),
        ("auto", True, "cuda"),
        ("cpu", True, "cpu"),
        ("cpu", False, "cpu"),
        ("cuda", True, "cuda"),
    ],
)
def test_the_device_type_follows_the_key_and_the_host(name, available, kind):
    assert dev.device_type(name, cuda_available=available) == kind


def test_auto_picks_what_this_host_has():
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert dev.device_type("auto") == want
    assert dev.agreed_device_type("auto") == want  # no process group: this host's own


def test_cuda_without_cuda_and_an_unknown_device_are_one_line_errors():
    with pytest.raises(UsageError, match=r"^device=cuda but CUDA is not available on this host"):
        dev.check_device("cuda", cuda_available=False)
    with pytest.raises(UsageError, match=r"^device=gpu is not one of auto \| cpu \| cuda$"):
        dev.check_device("gpu", cuda_available=True)


def test_the_model_groups_backend_is_derived_from_the_device():
    assert dev.ddp_backend(torch.device("cuda", 0)) == "nccl"
    assert dev.ddp_backend(torch.device("cpu")) == "gloo"
    group = object()
    assert dev.model_group("cpu", group) is group  # the CPU: the shuffle's own group


def test_each_worker_takes_its_local_rank_modulo_the_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert dev.local_device("cuda", 3) == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_RANK", "4")
    assert dev.local_device("cuda") == torch.device("cuda", 0)
    assert dev.local_device("cpu", 3) == torch.device("cpu")


def test_a_batch_on_the_cpu_is_not_copied():
    x = torch.arange(6.0)
    assert dev.to_device(x, torch.device("cpu")) is x


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA: the script runs")
def test_the_gpu_check_says_it_was_not_run_where_there_is_no_gpu():
    script = Path(__file__).resolve().parent.parent / "scripts" / "check_gpu.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "CUDA is not available on this machine: nothing was run" in out.stdout
