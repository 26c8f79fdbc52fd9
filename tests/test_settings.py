"""``ShuffleSettings`` checks every field when it is made: a bad value of any field is one
:class:`UsageError` line naming the field and its valid values (the library's keyword, or the
training job's Hydra key); what depends on the job (storage against ``K``, the master's rank
against the ranks) is checked when ``CodedShuffle`` starts, on every rank alike."""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from pathlib import Path

import pytest

from coded_shuffle import ShuffleSettings
from coded_shuffle.distributed.transports import JOB_NAMES
from coded_shuffle.errors import UsageError
from tests.ranks import run_ranks

BAD = {  # field -> (a bad value, what the line says)
    "scheme": ("nosuch", r"^scheme='nosuch' unknown; valid: attia-tandon, .*uncoded$"),
    "storage": (0.5, r"^storage=0\.5 out of range \(>= 1 and <= the workers\)$"),
    "seed": (1.5, r"^seed=1\.5: an integer$"),
    "shuffle": ("some", r"^shuffle='some' unknown; valid: full, partial, none$"),
    "fraction": (0.0, r"^fraction=0\.0 out of range \(0, 1\]$"),
    "placement": ("sorted", r"^placement='sorted' unknown; valid: random, by_label$"),
    "transport": ("pigeon", r"^transport='pigeon' unknown; valid: chain, .*unicast$"),
    "transport_options": (
        {"speed": 1},
        r"^transport_options\['speed'\] is not an option of transport=chain; valid: order, ",
    ),
    "chunk_bytes": (0, r"^chunk_bytes=0 out of range \(must be >= 1\)$"),
    "epochs": (0, r"^epochs=0 out of range \(must be >= 1\)$"),
    "drop_last": ("yes", r"^drop_last='yes': True or False$"),
    "timeout": ("soon", r"^timeout='soon': seconds > 0, or a datetime\.timedelta$"),
    "heartbeat": (-1, r"^heartbeat=-1 out of range \(seconds >= 0; 0: no watchdog\)$"),
    "store_dir": (7, r"^store_dir=7: a directory \(str or path\), or None$"),
    "keep_batch": (True, r"^keep_batch=True needs a store_dir: the batch is kept there$"),
    "first_epoch": (0, r"^first_epoch=0 out of range 1\.\.epochs$"),
    "previous_workers": (0, r"^previous_workers=0 out of range \(>= 1\)$"),
    "stream": (None, r"^stream=None: True or False$"),
    "master_rank": (-1, r"^master_rank=-1 out of range \(a rank, >= 0\)$"),
    "prefetch": ("off", r"^prefetch='off': True or False$"),
}


def test_every_field_has_a_bad_value_here():
    fields = {f.name for f in dataclasses.fields(ShuffleSettings)} - {"names"}
    assert fields == set(BAD)


@pytest.mark.parametrize("field", sorted(BAD))
def test_a_bad_value_of_each_field_is_one_line_naming_it(field):
    value, message = BAD[field]
    with pytest.raises(UsageError) as raised:
        ShuffleSettings(**{field: value})
    line = str(raised.value)
    assert "\n" not in line and re.search(message, line), line


def test_the_job_names_its_keys_in_the_same_lines():
    with pytest.raises(UsageError, match=r"^dist\.timeout_seconds=-3 out of range"):
        ShuffleSettings(timeout=timedelta(seconds=-3), names=JOB_NAMES)
    with pytest.raises(UsageError, match=r"^dist\.master_rank='x': a rank of the job"):
        ShuffleSettings(master_rank="x", names=JOB_NAMES)


def test_seconds_and_paths_are_taken_as_the_user_gives_them():
    made = ShuffleSettings(timeout=30, store_dir="runs/stores", transport_options=None)
    assert made.timeout == timedelta(seconds=30)
    assert made.store_dir == Path("runs/stores") and made.transport_options == {}


def _started(rank: int, world: int, options: dict) -> str:
    import torch
    from torch.utils.data import TensorDataset

    from coded_shuffle import CodedShuffle

    data = TensorDataset(torch.zeros(12, 2)) if rank == options.get("master_rank", 0) else None
    try:
        CodedShuffle(data, heartbeat=0, **options).close()
    except UsageError as exc:
        return str(exc)
    return "started"


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"storage": 5.0}, "storage=5 out of range 1..2 (workers)"),
        ({"master_rank": 3}, "master_rank=3 out of range 0..2 (the job's ranks)"),
    ],
)
def test_what_depends_on_the_job_is_checked_at_start_on_every_rank(options, message):
    assert run_ranks(3, _started, options) == [message] * 3
