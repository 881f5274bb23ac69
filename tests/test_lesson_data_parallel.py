"""Lesson 07's collectives primer: the pictured ring follows labtools' ring schedule step by step."""

import pytest

from lessons.data_parallel.collectives import KINDS, RING, after, before, ring_states


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_the_pictured_ring_holds_one_full_chunk_per_rank_after_the_reduce_scatter_and_everything_at_the_end(n):
    states = ring_states(n)
    everyone = set(range(n))
    assert len(states) == 2 * (n - 1) + 1 and states[0] == before(RING, n)
    mid = states[n - 1]  # after the reduce-scatter
    assert all(mid[r][(r + 1) % n] == everyone for r in range(n))
    assert sum(cell == everyone for row in mid for cell in row) == n  # exactly one full chunk per rank
    assert states[-1] == after("all_reduce", n)


def test_every_collective_has_a_before_and_an_after_and_a_wrong_name_is_refused():
    for kind in KINDS:
        assert len(before(kind, 3)) == len(after(kind, 3)) == 3
    with pytest.raises(ValueError, match="collective must be one of"):
        after("allreduce", 3)
