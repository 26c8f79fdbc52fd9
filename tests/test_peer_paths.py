"""Paths across symbols (docs/decentralized.md, section 2d; :mod:`coded_shuffle.math.schemes.
peer_paths`): every path the search takes can be sent by one worker and decoded by every
receiver of each of its symbols, the counts are never overdrawn, and a set with no path saves
nothing."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from coded_shuffle.math.schemes.peer_paths import SymbolType, find_paths, saved

K = 6


@st.composite
def symbol_types(draw: st.DrawFn) -> dict[SymbolType, int]:
    """Random types over ``K`` workers: receivers and knowers disjoint (a receiver never
    stores its own term), both non-empty, with counts."""
    out: dict[SymbolType, int] = {}
    for _ in range(draw(st.integers(1, 12))):
        receivers = draw(st.integers(1, (1 << K) - 1))
        knowers = draw(st.integers(1, (1 << K) - 1)) & ~receivers
        if knowers:
            out[SymbolType(receivers, knowers)] = draw(st.integers(1, 5))
    return out


@given(symbol_types())
@settings(max_examples=200, deadline=None)
def test_every_path_has_a_sender_and_covers_every_receiver(counts):
    paths = find_paths(counts)
    used: Counter = Counter()
    for path in paths:
        assert len(path.types) >= 2 and path.copies >= 1
        for i, t in enumerate(path.types):
            assert (t.knowers >> path.sender) & 1, "the sender must store every term"
            others = 0
            for j, u in enumerate(path.types):
                others |= u.knowers if j != i else 0
            assert t.receivers & ~others == 0, "every receiver must know another symbol whole"
            used[t] += path.copies
    assert all(used[t] <= counts[t] for t in used)
    assert saved(paths) == sum(p.copies for p in paths)


def test_three_lone_pieces_around_a_cycle_make_one_path():
    """Worker 3 holds pieces for 0, 1 and 2, each of whom knows the next one's: two symbols
    for three."""
    counts = {
        SymbolType(1 << 0, (1 << 3) | (1 << 1)): 4,
        SymbolType(1 << 1, (1 << 3) | (1 << 2)): 4,
        SymbolType(1 << 2, (1 << 3) | (1 << 0)): 4,
    }
    (path,) = find_paths(counts)
    assert path.sender == 3 and path.copies == 4 and sorted(path.types) == sorted(counts)


def test_symbols_nobody_else_can_stand_for_make_no_path():
    """Two receivers that know nothing but their own symbol's sender: nothing to save."""
    counts = {SymbolType(1 << 0, 1 << 2): 3, SymbolType(1 << 1, 1 << 2): 3}
    assert find_paths(counts) == []
