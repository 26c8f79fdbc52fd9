"""A run's start as one typed value: what the run directory holds decides it, in one function
(coded_shuffle_train/shuffle_sgd/start.py), and every mode carries exactly the fields it needs."""

from __future__ import annotations

import dataclasses

import pytest

from coded_shuffle_train.shuffle_sgd.start import (
    AfterEpoch,
    Complete,
    Fresh,
    InsideEpoch,
    Resized,
    Saved,
    decide,
)

NONE_HELD: list[set[tuple[int, int]]] = [set(), set(), set()]


def test_nothing_saved_is_a_fresh_run():
    assert decide(None, 3, delivered=False, held=NONE_HELD, epochs=10) == Fresh()
    assert Fresh().done == 0 and Fresh().first_epoch == 1 and Fresh().record() == {}


def test_a_checkpoint_resumes_after_its_epoch_on_the_same_chain():
    start = decide(
        Saved(done=4, workers=3, first_epoch=2), 3, delivered=False, held=NONE_HELD, epochs=10
    )
    assert start == AfterEpoch(done=4, first_epoch=2)
    assert start.record() == {"resumed_after_epoch": 4}


def test_another_number_of_workers_is_a_resize_whatever_the_step_checkpoints():
    held = [{(5, 8)}, {(5, 8)}]
    start = decide(Saved(done=4, workers=3, first_epoch=1), 2, delivered=True, held=held, epochs=10)
    assert start == Resized(done=4, workers_before=3, workers_after=2)
    assert start.first_epoch == 5  # the new number's placement
    assert start.record() == {
        "resumed_after_epoch": 4,
        "workers_before": 3,
        "workers_after": 2,
    }


@pytest.mark.parametrize(
    ("held", "step"),
    [
        ([{(5, 4), (5, 8)}, {(5, 4), (5, 8)}, {(5, 8), (5, 4)}], 8),  # every worker at 8
        ([{(5, 4), (5, 8)}, {(5, 4)}, {(5, 4), (5, 8)}], 4),  # one worker got no further
        ([{(5, 4), (5, 8)}, {(5, 4), (5, 6)}, {(5, 4), (5, 8)}], 4),  # the last step in common
        ([{(5, 8)}, {(5, 4)}, {(5, 8)}], 0),  # none in common: after the epoch
        ([{(4, 8)}, {(4, 8)}, {(4, 8)}], 0),  # steps of the epoch before: after the epoch
    ],
)
def test_inside_an_epoch_at_the_last_step_every_worker_holds(held, step):
    start = decide(Saved(done=4, workers=3, first_epoch=1), 3, delivered=True, held=held, epochs=10)
    if step:
        assert start == InsideEpoch(done=4, first_epoch=1, step=step)
        assert start.record() == {"resumed_at_step": step}
    else:
        assert start == AfterEpoch(done=4, first_epoch=1)


def test_inside_an_epoch_needs_the_masters_delivery_record():
    held = [{(5, 4)}, {(5, 4)}, {(5, 4)}]
    start = decide(
        Saved(done=4, workers=3, first_epoch=1), 3, delivered=False, held=held, epochs=10
    )
    assert start == AfterEpoch(done=4, first_epoch=1)


def test_a_kill_inside_the_placement_resumes_inside_it_without_a_checkpoint():
    held = [{(1, 2)}, {(1, 2)}, {(1, 2)}]
    assert decide(None, 3, delivered=True, held=held, epochs=10) == InsideEpoch(0, 1, 2)


def test_a_checkpoint_of_the_last_epoch_is_a_complete_run_whatever_the_workers_now():
    """The same command after the run ended (by an operator, or a supervisor that restarts
    it): nothing left to deliver, also with another number of workers (no resize past the
    last epoch)."""
    for workers in (3, 2):
        start = decide(Saved(done=10, workers=3, first_epoch=1), workers, False, [], epochs=10)
        assert start == Complete(10) and start.record() == {}


def test_every_mode_is_a_frozen_dataclass_with_only_its_own_fields():
    fields = {
        cls.__name__: [f.name for f in dataclasses.fields(cls)]
        for cls in (Fresh, AfterEpoch, InsideEpoch, Resized, Complete)
    }
    assert fields == {
        "Fresh": [],
        "AfterEpoch": ["done", "first_epoch"],
        "InsideEpoch": ["done", "first_epoch", "step"],
        "Resized": ["done", "workers_before", "workers_after"],
        "Complete": ["done"],
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        AfterEpoch(1, 1).done = 2  # type: ignore[misc]
