"""The ring all-reduce written out against dist.all_reduce, on real gloo ranks."""

import pytest

from labtools.layout import collective_bytes
from labtools.parallel import launch
from labtools.parallel.checks import Sizes, ring_parity

pytestmark = pytest.mark.ranks  # every test here starts ranks


@pytest.mark.parametrize("world", [2, 3])
def test_ring_all_reduce_matches_torch(world):
    sizes = [1, 7, 64, 1001]
    results = launch(ring_parity, world, Sizes(tuple(sizes)), show_progress=False)
    for r in results:
        assert list(r.by_size) == sizes
        for n in sizes:
            assert r.by_size[n].max_diff <= 1e-5, (world, n)
    for n in sizes:  # every rank together sends 2(N-1) · M bytes; unequal chunks spread it unevenly
        total = sum(r.by_size[n].sent for r in results)
        assert total == pytest.approx(world * collective_bytes("all_reduce", 4 * n, world))
