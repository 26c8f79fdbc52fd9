"""Which rank plays which role (:mod:`coded_shuffle.distributed.roles`), checked against the
mapping written out here: the master's rank is role 0, the other ranks are workers ``0..K-1``
in rank order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coded_shuffle.distributed.roles import Roles
from coded_shuffle.errors import UsageError


@st.composite
def roles(draw) -> Roles:
    world = draw(st.integers(2, 40))
    return Roles(master=draw(st.integers(0, world - 1)), world=world)


@given(roles())
def test_every_rank_plays_the_role_its_place_among_the_ranks_gives_it(r):
    workers = [rank for rank in range(r.world) if rank != r.master]
    assert r.rank(0) == r.master and r.role(r.master) == 0
    assert r.worker_ranks() == workers
    for w, rank in enumerate(workers):
        assert r.rank(w + 1) == rank and r.role(rank) == w + 1
    by_rank = [f"from rank {rank}" for rank in range(r.world)]
    assert r.by_role(by_rank) == [by_rank[r.master]] + [by_rank[k] for k in workers]


@pytest.mark.parametrize("master", [-1, 5])
def test_a_master_rank_outside_the_job_is_one_line(master):
    with pytest.raises(UsageError, match=rf"master_rank={master} out of range 0\.\.4"):
        Roles(master=master, world=5).check()
