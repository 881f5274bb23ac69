"""Lesson 08, section 1: what each rank holds — parameters, gradients and AdamW state per strategy."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_most, is_true
from labtools.parallel import launch
from lessons.fsdp_zero import STRATEGIES, TIMEOUT_S, Settings, Strategy, predicted, ranks
from lessons.fsdp_zero.partition_exercise import reference as greedy_partition  # ZeRO-1's rule, as taught


def run(S: Settings, world: int) -> list[dict]:
    return launch(ranks.sharding, world, S, desc=f"sharding × {world}", timeout_s=TIMEOUT_S)


def prediction_table(results: dict[int, list[dict]]) -> go.Figure:
    rows = []
    for w, res in results.items():
        for s in STRATEGIES:
            if s is Strategy.ZERO3_BF16:
                continue
            m = res[0][s]
            p = predicted(m["n_params"], s, w)
            held = "params held fwd→bwd" if s.zero_stage == 2 else "params"
            measured_params = m["held_after_forward"] if s.zero_stage == 2 else m["params"]
            rows.append((f"{w} ranks", s.label, f"{measured_params:,} / {p['params']:,}",
                         f"{m['grads']:,} / {p['grads']:,}", f"{m['optimizer']:,} / {p['optimizer']:,}", held))
    return plots.table(("", "strategy", "params: measured / predicted", "grads", "optimizer state", "params counted"),
                       rows, title="Rank 0's bytes, measured from its local tensors / labtools.budget.estimate",
                       row_height=34)


def findings(ledger: Ledger, shard: dict[int, list[dict]]) -> Findings:
    bullets = []
    for w, res in shard.items():
        z3 = [r[Strategy.ZERO3] for r in res]
        n = z3[0]["n_params"]
        full = 4 * n
        worst = max(abs(r[k] - full / w) for r in z3 for k in ("params", "grads")) / (full / w)
        p = predicted(n, Strategy.ZERO3, w)
        z1 = [r[Strategy.ZERO1] for r in res]
        ledger.add(f"z3_1overN_{w}", f"{w} ranks, fully_shard: each rank holds 1/N of parameters and gradients "
                   "(worst relative deviation over ranks: padding)", worst, at_most(0.05), kind="measured")
        ledger.add(f"z3_sum_{w}", f"… and the shards add up to the whole model ({w} ranks)",
                   sum(r["params"] for r in z3) == full, is_true(), kind="measured")
        ledger.add(f"z3_opt_{w}", f"… and 1/N of AdamW's state: 2 × its parameter shard ({w} ranks)",
                   all(r["optimizer"] == 2 * r["params"] for r in z3), is_true(), kind="measured")
        ledger.add(f"z3_pred_{w}", f"Per-rank bytes equal labtools.budget's ZeRO-3 prediction (worst relative gap, "
                   f"{w} ranks)", max(abs(r[k] - p[k]) / p[k] for r in z3 for k in ("params", "grads", "optimizer")),
                   at_most(0.05), kind="measured")
        ledger.add(f"z1_sum_{w}", f"ZeRO-1 shards only the optimizer state: the partitions add up to the whole "
                   f"({w} ranks)", sum(r["optimizer"] for r in z1) == 8 * n and all(r["params"] == full for r in z1),
                   is_true(), kind="measured")
        even = 8 * n / w
        shares = [r["optimizer"] / even for r in z1]
        ledger.add(f"z1_whole_params_{w}", f"ZeRO-1's partitions are uneven by less than one parameter's state: "
                   f"ZeroRedundancyOptimizer gives each rank whole parameters ({w} ranks; worst |partition − even "
                   "share| ÷ the largest parameter's AdamW state, measured)",
                   max(abs(r["optimizer"] - even) for r in z1) / (8 * z1[0]["largest_param"]), at_most(1.0),
                   kind="measured")
        ledger.add(f"z1_greedy_{w}", f"ZeroRedundancyOptimizer's partition is the rule the exercise teaches: largest "
                   f"parameter first, to the least-loaded rank ({w} ranks; the partitions made, equal)",
                   [r["partition"] for r in z1] == greedy_partition(z1[0]["sizes"], w), is_true(), kind="measured")
        d, r0z3 = res[0][Strategy.DDP], z3[0]
        bullets.append(f"**{w} ranks**, fully_shard: rank 0 holds {r0z3['params'] / d['params']:.3f} of DDP's "
                       f"parameters, {r0z3['grads'] / d['grads']:.3f} of its gradients and "
                       f"{r0z3['optimizer'] / d['optimizer']:.3f} of its optimizer state; 1/N = {1 / w:.3f}.")
        bullets.append(f"**{w} ranks**, ZeRO-1: the optimizer partitions are {', '.join(f'{x:.3f}' for x in shares)} "
                       "× the even share, because ZeroRedundancyOptimizer gives each rank whole parameters.")
    w0 = min(shard)
    r0 = shard[w0][0]
    z2, z3, mp = r0[Strategy.ZERO2], r0[Strategy.ZERO3], r0[Strategy.ZERO3_BF16]
    ledger.add("reshard", "Without resharding, the whole unsharded model is held between forward and backward "
               "(held ÷ model bytes)", z2["held_after_forward"] / (4 * z2["n_params"]), approx(1.0, abs=1e-9),
               kind="measured")
    ledger.add("reshard_z3", "With it, only the shard (held ÷ model bytes × N)",
               z3["held_after_forward"] / (4 * z3["n_params"]) * w0, approx(1.0, rel=0.05), kind="measured")
    bullets += [
        f"Between forward and backward, ZeRO-3 (resharding) kept **{z3['held_after_forward']:,}** bytes of "
        f"parameters; ZeRO-2 kept **{z2['held_after_forward']:,}**, the whole model.",
        f"With bf16 parameters the all-gathers carried {mp['input_bytes'].get('all_gather_single', 0):,} bytes "
        f"instead of {z3['input_bytes'].get('all_gather_single', 0):,}; the stored shards stay fp32 "
        f"({mp['params']:,} bytes).",
    ]
    return Findings(bullets)
