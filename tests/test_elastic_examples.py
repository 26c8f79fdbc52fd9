"""Yang et al. 2018's worked examples, and exact recovery of ``A x`` under every departure pattern.

Machines are numbered from 1 as in the paper; the code's positions are the available
machines in increasing order, its sub-blocks numbered from 0 (the paper's from 1).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from coded_shuffle.elastic.cyclic import CyclicUsage, GroupCode, worker_forward
from coded_shuffle.elastic.encoding import encode, split_blocks
from coded_shuffle.elastic.generator import systematic_generator
from coded_shuffle.elastic.membership import Membership
from coded_shuffle.elastic.products import (
    COLUMN_CODED,
    ROW_CODED,
    coded_blocks,
    mds_recover,
    recover,
    right_factors,
    worker_product,
)


def _group_machines(usage: CyclicUsage, members: Membership, group: int) -> list[int]:
    """The machines (paper numbering) whose rows form ``G_group`` (0-based group)."""
    return sorted(members.available[p] for p in usage.members[group])


def _used_subblocks(usage: CyclicUsage, members: Membership, machine: int) -> list[int]:
    """The sub-blocks (paper numbering) that ``machine`` uses."""
    return [int(j) + 1 for j in usage.usage[members.available.index(machine)]]


def test_fig_1_and_section_2_4_groups_with_six_machines():
    """``P = 6, L = 3``, nobody pre-empted: machine ``i`` uses sub-blocks ``i, i+1, i+2``
    (mod 6); ``G_1`` is built from machines 1, 5, 6 and ``G_6`` from machines 4, 5, 6."""
    members = Membership.initial(6, 3)
    usage = CyclicUsage(members.size, 3, block_rows=12)
    assert _used_subblocks(usage, members, 1) == [1, 2, 3]
    assert _used_subblocks(usage, members, 5) == [5, 6, 1]
    assert _used_subblocks(usage, members, 6) == [6, 1, 2]
    assert _group_machines(usage, members, 0) == [1, 5, 6]
    assert _group_machines(usage, members, 5) == [4, 5, 6]
    gen = systematic_generator(6, 3)
    code = GroupCode.build(usage, gen.rows[members.position_rows()])
    rows_of = {m: gen.rows[m - 1] for m in range(1, 7)}
    for group, machines in ((0, [1, 5, 6]), (5, [4, 5, 6])):
        got = {tuple(r) for r in code.matrices[group]}
        assert got == {tuple(rows_of[m]) for m in machines}
    assert np.all(usage.rows_used() == 3 * 12 // 6)  # L b / n rows each (Theorem 2.1)


def test_section_3_1_two_machines_pre_empted():
    """Machines 2 and 4 pre-empted: each block is cut into 4 sub-blocks; machine 1 uses
    sub-blocks 1, 2, 3 and machine 3 uses 2, 3, 4 (the paper's example)."""
    members = Membership.initial(6, 3)
    members.leave([2, 4], step=1)
    assert members.available == [1, 3, 5, 6]
    usage = CyclicUsage(members.size, 3, block_rows=12)
    assert _used_subblocks(usage, members, 1) == [1, 2, 3]
    assert _used_subblocks(usage, members, 3) == [2, 3, 4]
    assert _used_subblocks(usage, members, 5) == [3, 4, 1]
    assert _used_subblocks(usage, members, 6) == [4, 1, 2]
    assert np.all(usage.rows_used() == 3 * 12 // 4)


@pytest.mark.parametrize("lost", range(4))
def test_a_x_is_recovered_exactly_under_every_departure_pattern(lost):
    """``P = 6, L = 3``: for every set of up to ``P - L`` pre-empted machines, Algorithm 1
    (round 1 at the available machines, ``G_j^{-1}`` at the master) gives ``A x`` to rounding
    error; the data, its blocks and ``x`` are random."""
    rng = np.random.default_rng(lost)
    a = rng.standard_normal((90, 7))
    x = rng.standard_normal(7)
    blocks = split_blocks(a, 3)
    gen = systematic_generator(6, 3)
    coded = encode(blocks, gen.rows)
    for gone in itertools.combinations(range(1, 7), lost):
        members = Membership.initial(6, 3)
        if gone:
            members.leave(list(gone), step=1)
        usage = CyclicUsage(members.size, 3, blocks.shape[1])
        code = GroupCode.build(usage, gen.rows[members.position_rows()])
        results = [
            worker_forward(coded[members.row_of[m]][usage.rows(p)], x)
            for p, m in enumerate(members.available)
        ]
        got = code.decode(results).reshape(-1)[: a.shape[0]]
        assert np.allclose(got, a @ x, rtol=0, atol=1e-9), gone


@pytest.mark.parametrize("lost", range(4))
def test_a_b_is_recovered_exactly_under_every_departure_pattern(lost):
    """Sec. 3.1 (Lemma 3.1): ``A`` in column blocks, ``B``'s row blocks encoded per group with
    ``H_j = (G_j^T)^{-1}`` (eq. (7)); the sum of the available machines' products is ``A B``
    for every set of up to ``P - L`` pre-empted machines (``P = 6, L = 3``)."""
    rng = np.random.default_rng(10 + lost)
    a, b = rng.standard_normal((11, 41)), rng.standard_normal((41, 5))
    gen = systematic_generator(6, 3)
    stored = coded_blocks(a, gen.rows, COLUMN_CODED)
    assert stored.shape == (6, 14, 11)  # ceil(41 / 3) columns per block, stored transposed
    for gone in itertools.combinations(range(1, 7), lost):
        members = Membership.initial(6, 3)
        if gone:
            members.leave(list(gone), step=1)
        usage = CyclicUsage(members.size, 3, stored.shape[1])
        code = GroupCode.build(usage, gen.rows[members.position_rows()])
        factors = right_factors(code, b, COLUMN_CODED)
        results = [
            worker_product(stored[members.row_of[m]][usage.rows(p)], factors[p], COLUMN_CODED)
            for p, m in enumerate(members.available)
        ]
        got = recover(code, results, a.shape[0], COLUMN_CODED)
        assert np.allclose(got, a @ b, rtol=0, atol=1e-9), gone


def test_non_adaptive_mds_decodes_from_every_l_machines():
    """The baseline: any ``L`` whole-block products ``A~_s x`` give ``A x``."""
    rng = np.random.default_rng(3)
    a, x = rng.standard_normal((40, 9)), rng.standard_normal(9)
    gen = systematic_generator(6, 3)
    stored = coded_blocks(a, gen.rows, ROW_CODED)
    for chosen in itertools.combinations(range(6), 3):
        got = mds_recover(gen.rows[list(chosen)], [stored[s] @ x for s in chosen], 40)
        assert np.allclose(got, a @ x, rtol=0, atol=1e-9), chosen
