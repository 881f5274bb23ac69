"""Lesson 08's collectives timeline: calls grouped by the phase they were made in, and claims that can fail."""

from lessons.fsdp_zero import Strategy
from lessons.fsdp_zero.ranks import ShardingResult, StrategyResult


def sharding_with_events(z2: list[tuple[str, int]], z3: list[tuple[str, int]]) -> ShardingResult:
    """A rank's sharding result holding only ZeRO-2's and ZeRO-3's collectives of a step (the rest zero)."""
    def strategy(events):
        return StrategyResult(params=0, held_after_forward=0, grads=0, optimizer=0, calls={}, input_bytes={},
                              events=events, wire_bytes=None)
    return ShardingResult(sizes=[1], strategies={Strategy.ZERO2: strategy(z2), Strategy.ZERO3: strategy(z3)})


def test_the_timeline_groups_calls_by_phase_and_its_claims_can_fail():
    from labtools.claims import Ledger
    from lessons.fsdp_zero import picture

    ag, rs = ("all_gather_single", 100), ("reduce_scatter_single", 400)
    z3 = [("forward", 0), ag, ag, ("backward", 0), ag, ag, rs, rs, ("optimizer step", 0)]
    z2 = [("forward", 0), ag, ag, ("backward", 0), rs, rs, ("optimizer step", 0)]
    assert picture.phases(z3) == {"forward": [("all-gather", 100)] * 2,
                                  "backward": [("all-gather", 100)] * 2 + [("reduce-scatter", 400)] * 2,
                                  "optimizer step": []}
    shard = {2: [sharding_with_events(z2, z3)]}
    ledger = Ledger("t")
    picture.timeline_findings(ledger, shard)
    assert ledger.all_passed
    assert len(picture.timeline_figure(shard).data) == 10  # one bar per collective
    ledger = Ledger("t")  # a ZeRO-3 that did not gather again in backward
    picture.timeline_findings(ledger, {2: [sharding_with_events(z2, z2)]})
    assert not ledger.claims[0].passed
