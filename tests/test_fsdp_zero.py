

def test_the_timeline_groups_calls_by_phase_and_its_claims_can_fail():
    from labtools.claims import Ledger
    from lessons.fsdp_zero import Strategy, picture

    ag, rs = ("all_gather_single", 100), ("reduce_scatter_single", 400)
    z3 = [("forward", 0), ag, ag, ("backward", 0), ag, ag, rs, rs, ("optimizer step", 0)]
    z2 = [("forward", 0), ag, ag, ("backward", 0), rs, rs, ("optimizer step", 0)]
    assert picture.phases(z3) == {"forward": [("all-gather", 100)] * 2,
                                  "backward": [("all-gather", 100)] * 2 + [("reduce-scatter", 400)] * 2,
                                  "optimizer step": []}
    shard = {2: [{Strategy.ZERO2: {"events": z2}, Strategy.ZERO3: {"events": z3}}]}
    ledger = Ledger("t")
    picture.timeline_findings(ledger, shard)
    assert ledger.all_passed
    assert len(picture.timeline_figure(shard).data) == 10  # one bar per collective
    ledger = Ledger("t")  # a ZeRO-3 that did not gather again in backward
    picture.timeline_findings(ledger, {2: [{Strategy.ZERO2: {"events": z2}, Strategy.ZERO3: {"events": z2}}]})
    assert not ledger.claims[0].passed
