"""Lesson 08, section 1: what each rank holds — parameters, gradients and AdamW state per strategy."""

from labtools.claims import Findings, Ledger, approx, at_most, is_true
from labtools.parallel import launch
from lessons.fsdp_zero import TIMEOUT_S, Settings, Strategy, predicted, ranks
from lessons.fsdp_zero.partition_exercise import reference as greedy_partition  # ZeRO-1's rule, as taught
from lessons.fsdp_zero.ranks import ShardingResult


def run(S: Settings, world: int) -> list[ShardingResult]:
    return launch(ranks.sharding, world, S, desc=f"sharding × {world}", timeout_s=TIMEOUT_S)


def where(res: list) -> str:
    """Where a launch's ranks ran, in words: "gloo processes on the CPU" or "NCCL processes, one GPU each"."""
    backend = res.dist[0].backend
    on_cpu = all(d.device == "cpu" for d in res.dist)
    return f"{backend} processes on the CPU" if on_cpu else f"{backend} processes, one GPU each"


def findings(ledger: Ledger, shard: dict[int, list[ShardingResult]]) -> Findings:
    """Each claim merged over the world sizes (the worst of them), then the answer and the run's numbers."""
    ws = " and ".join(map(str, shard))
    worst_z3, z1_sum, z1_uneven, z1_greedy, z1_off = 0.0, True, 0.0, True, 0.0
    rows = []
    for w, res in shard.items():
        z3 = [r.strategies[Strategy.ZERO3] for r in res]
        n = res[0].n_params
        p = predicted(n, Strategy.ZERO3, w)
        # every rank, every part, against the calculator's 1/N share (an unsharded part is off by N - 1)
        worst_z3 = max(worst_z3, max(abs(v - q) / q for r in z3 for v, q in
                                     ((r.params, p.params), (r.grads, p.grads), (r.optimizer, p.optimizer))))
        z1 = [r.strategies[Strategy.ZERO1] for r in res]
        z1_sum &= sum(r.optimizer for r in z1) == 8 * n and all(r.params == 4 * n for r in z1)
        even = 8 * n / w
        shares = [r.optimizer / even for r in z1]
        z1_uneven = max(z1_uneven, max(abs(r.optimizer - even) for r in z1) / (8 * res[0].largest_param))
        z1_greedy &= [r.partition for r in z1] == greedy_partition(res[0].sizes, w)
        z1_off = max(z1_off, max(abs(x - 1) for x in shares))
        rows.append(f"| {w} | {z3[0].params / (4 * n):.3f} | {max(shares):.3f} to {min(shares):.3f} |")
    ledger.add("z3_share", f"ZeRO-3 leaves each rank 1/N of the parameters, gradients and optimizer state, as the "
               f"lab's calculator predicts ({ws} ranks; worst relative gap over ranks and parts: padding)", worst_z3,
               at_most(0.05), kind="measured")
    ledger.add("z1_sum", f"ZeRO-1 shards only the optimizer state: the partitions add up to the whole, the parameters "
               f"stay whole on every rank ({ws} ranks)", z1_sum, is_true(), kind="measured")
    ledger.add("z1_whole_params", f"ZeRO-1's partitions are uneven by less than one parameter's state, since each rank "
               f"keeps whole parameters ({ws} ranks; worst |partition − even share| ÷ the largest parameter's AdamW "
               "state)", z1_uneven, at_most(1.0), kind="measured")
    ledger.add("z1_greedy", f"PyTorch's ZeRO-1 partition is the rule the exercise teaches: largest parameter first, to "
               f"the least-loaded rank ({ws} ranks; the partitions made, equal)", z1_greedy, is_true(),
               kind="measured", detail=True)
    w0 = min(shard)
    r0 = shard[w0][0]
    n = r0.n_params
    z2, z3 = r0.strategies[Strategy.ZERO2], r0.strategies[Strategy.ZERO3]
    ledger.add("reshard", "Without resharding (ZeRO-2), the whole unsharded model is held between forward and "
               "backward (held ÷ model bytes)", z2.held_after_forward / (4 * n), approx(1.0, abs=1e-9),
               kind="measured")
    ledger.add("reshard_z3", "With resharding (ZeRO-3), only the shard is held between forward and backward (held ÷ "
               "model bytes × N)", z3.held_after_forward / (4 * n) * w0, approx(1.0, rel=0.05),
               kind="measured", detail=True)
    exact = "to the byte" if worst_z3 == 0 else "but for a little padding"
    table = ("| N | ZeRO-3: rank 0's share of every part | ZeRO-1: largest to smallest partition ÷ an even share |\n"
             "|---|---|---|\n" + "\n".join(rows))
    return Findings([
        f"Under ZeRO-3 each rank holds $1/N$ of the parameters, gradients and optimizer state, {exact}; ZeRO-2 holds "
        "the whole parameters again between forward and backward.",
        f"ZeRO-1 shards only the optimizer state, by whole parameters: its shares miss the even split by up to "
        f"**{z1_off:.0%}**.",
    ], [
        table,
        "The lab's calculator (lesson 06) predicts these bytes exactly for ZeRO-2 and ZeRO-3. For ZeRO-1 it predicts "
        "an even split of the optimizer state, which whole parameters cannot give.",
        "With bf16 parameters the all-gathers carry half the bytes; the stored shards stay fp32.",
        f"The ranks ran as {where(shard[w0])}.",
    ])
