"""Lesson 08, section 1: what each rank holds — parameters, gradients and AdamW state per strategy."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_most, is_true
from labtools.parallel import launch
from lessons.fsdp_zero import STRATEGIES, TIMEOUT_S, Settings, Strategy, predicted, ranks
from lessons.fsdp_zero.partition_exercise import reference as greedy_partition  # ZeRO-1's rule, as taught
from lessons.fsdp_zero.ranks import Call, ShardingResult


def run(S: Settings, world: int) -> list[ShardingResult]:
    return launch(ranks.sharding, world, S, desc=f"sharding × {world}", timeout_s=TIMEOUT_S)


def prediction_table(results: dict[int, list[ShardingResult]]) -> go.Figure:
    rows = []
    for w, res in results.items():
        for s in STRATEGIES:
            if s is Strategy.ZERO3_BF16:
                continue
            m = res[0].strategies[s]
            p = predicted(res[0].n_params, s, w)
            held = "params held fwd→bwd" if s.zero_stage == 2 else "params"
            measured_params = m.held_after_forward if s.zero_stage == 2 else m.params
            rows.append((f"{w} ranks", s.label, f"{measured_params:,} / {p.params:,}",
                         f"{m.grads:,} / {p.grads:,}", f"{m.optimizer:,} / {p.optimizer:,}", held))
    return plots.table(("", "strategy", "params: measured / predicted", "grads", "optimizer state", "params counted"),
                       rows, title="Rank 0's bytes: measured from its own tensors / predicted by the lab's calculator",
                       row_height=34)


def findings(ledger: Ledger, shard: dict[int, list[ShardingResult]]) -> Findings:
    """Each claim merged over the world sizes (the worst of them), then the answer and the run's numbers."""
    ws = " and ".join(map(str, shard))
    worst_z3, z3_sum, z3_opt, z3_pred, z1_sum, z1_uneven, z1_greedy, z1_off = 0.0, True, True, 0.0, True, 0.0, True, 0.0
    rows = []
    for w, res in shard.items():
        z3 = [r.strategies[Strategy.ZERO3] for r in res]
        n = res[0].n_params
        full = 4 * n
        worst_z3 = max(worst_z3, max(abs(v - full / w) for r in z3 for v in (r.params, r.grads)) / (full / w))
        p = predicted(n, Strategy.ZERO3, w)
        z3_sum &= sum(r.params for r in z3) == full
        z3_opt &= all(r.optimizer == 2 * r.params for r in z3)
        z3_pred = max(z3_pred, max(abs(v - q) / q for r in z3 for v, q in
                                   ((r.params, p.params), (r.grads, p.grads), (r.optimizer, p.optimizer))))
        z1 = [r.strategies[Strategy.ZERO1] for r in res]
        z1_sum &= sum(r.optimizer for r in z1) == 8 * n and all(r.params == full for r in z1)
        even = 8 * n / w
        shares = [r.optimizer / even for r in z1]
        z1_uneven = max(z1_uneven, max(abs(r.optimizer - even) for r in z1) / (8 * res[0].largest_param))
        z1_greedy &= [r.partition for r in z1] == greedy_partition(res[0].sizes, w)
        z1_off = max(z1_off, max(abs(x - 1) for x in shares))
        d, r0z3 = res[0].strategies[Strategy.DDP], z3[0]
        rows.append(f"| {w} | {r0z3.params / d.params:.3f} | {r0z3.grads / d.grads:.3f} | "
                    f"{r0z3.optimizer / d.optimizer:.3f} | {', '.join(f'{x:.3f}' for x in shares)} |")
    ledger.add("z3_1overN", f"fully_shard on {ws} ranks: each rank holds 1/N of parameters and gradients (worst "
               "relative deviation over ranks and world sizes: padding)", worst_z3, at_most(0.05), kind="measured")
    ledger.add("z3_sum", f"fully_shard's parameter shards add up to the whole model ({ws} ranks)", z3_sum, is_true(),
               kind="measured", detail=True)
    ledger.add("z3_opt", f"fully_shard: each rank's AdamW state is 2 × its parameter shard, 1/N of the whole ({ws} "
               "ranks)", z3_opt, is_true(), kind="measured", detail=True)
    ledger.add("z3_pred", f"Per-rank parameter, gradient and optimizer bytes equal the lab's calculator's ZeRO-3 "
               f"prediction (worst relative gap, {ws} ranks)", z3_pred, at_most(0.05), kind="measured")
    ledger.add("z1_sum", f"ZeRO-1 shards only the optimizer state: the partitions add up to the whole ({ws} ranks)",
               z1_sum, is_true(), kind="measured")
    ledger.add("z1_whole_params", f"ZeRO-1's partitions are uneven by less than one parameter's state: "
               f"ZeroRedundancyOptimizer gives each rank whole parameters ({ws} ranks; worst |partition − even "
               "share| ÷ the largest parameter's AdamW state, measured)", z1_uneven, at_most(1.0), kind="measured")
    ledger.add("z1_greedy", f"ZeroRedundancyOptimizer's partition is the rule the exercise teaches: largest "
               f"parameter first, to the least-loaded rank ({ws} ranks; the partitions made, equal)", z1_greedy,
               is_true(), kind="measured", detail=True)
    w0 = min(shard)
    r0 = shard[w0][0]
    n = r0.n_params
    z2, z3, mp = (r0.strategies[s] for s in (Strategy.ZERO2, Strategy.ZERO3, Strategy.ZERO3_BF16))
    ledger.add("reshard", "Without resharding (ZeRO-2), the whole unsharded model is held between forward and "
               "backward (held ÷ model bytes)", z2.held_after_forward / (4 * n), approx(1.0, abs=1e-9),
               kind="measured")
    ledger.add("reshard_z3", "With resharding (ZeRO-3), only the shard is held between forward and backward (held ÷ "
               "model bytes × N)", z3.held_after_forward / (4 * n) * w0, approx(1.0, rel=0.05),
               kind="measured", detail=True)
    exact = "to the byte" if worst_z3 == 0 else f"within {worst_z3:.1%} (padding)"
    table = "| N | ZeRO-3, rank 0 ÷ DDP: parameters | gradients | optimizer state | ZeRO-1: partitions ÷ even share " \
            "|\n|---|---|---|---|---|\n" + "\n".join(rows)
    return Findings([
        f"Under ZeRO-3 each rank holds $1/N$ of the parameters, gradients and optimizer state, {exact}; ZeRO-2 holds "
        "the whole parameters again between forward and backward.",
        f"ZeRO-1 shards only the optimizer state, by whole parameters: its shares miss the even split by up to "
        f"**{z1_off:.0%}**.",
    ], [
        table,
        f"Parameters held between forward and backward on {w0} ranks: ZeRO-3 {z3.held_after_forward:,} bytes, "
        f"ZeRO-2 {z2.held_after_forward:,}, the whole model.",
        f"With bf16 parameters the all-gathers carried half the bytes "
        f"({mp.input_bytes.get(Call.ALL_GATHER_SINGLE, 0):,} instead of "
        f"{z3.input_bytes.get(Call.ALL_GATHER_SINGLE, 0):,}); the stored shards stay fp32.",
    ])
