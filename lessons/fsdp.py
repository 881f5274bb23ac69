"""Lesson 08 — FSDP and ZeRO: sharded model states, measured per rank against the memory prediction, and what
sharding costs in communication.

The notebook side of notebooks/08_fsdp_zero.ipynb; the functions that run inside the ranks are in
lessons/ranks/fsdp.py.
"""

from dataclasses import dataclass

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Ledger, approx, at_most, is_true
from labtools.dist import GPTJob, launch
from labtools.memory import estimate
from labtools.profiles import check_range, resolve
from lessons.ranks import fsdp as ranks
from lessons.ranks.fsdp import STRATEGIES, ZERO_STAGE


@dataclass(frozen=True)
class Settings:
    profile: str
    n_layer: int
    n_embd: int
    block_size: int
    batch_size: int      # per rank
    steps: int           # training steps of the FSDP vs DDP comparison
    world_sizes: tuple   # ranks for the sharding measurements
    lr: float = 3e-3
    seed: int = 0

    def __post_init__(self):
        check_range("STEPS", self.steps, 1, 10_000, int)
        check_range("BATCH_SIZE", self.batch_size, 1, 1024, int)
        check_range("SEED", self.seed, 0, 2**31 - 1, int)
        if not self.world_sizes or min(self.world_sizes) < 2:
            raise ValueError(f"WORLD_SIZES must be ints >= 2 (sharding needs ranks), got {self.world_sizes!r}")


PROFILES = {
    "smoke": Settings("smoke", n_layer=2, n_embd=64, block_size=64, batch_size=8, steps=10, world_sizes=(2, 4)),
    "cpu": Settings("cpu", n_layer=2, n_embd=64, block_size=64, batch_size=8, steps=40, world_sizes=(2, 4)),
    "gpu": Settings("gpu", n_layer=6, n_embd=384, block_size=256, batch_size=16, steps=200, world_sizes=(2, 4)),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def job(S: Settings) -> GPTJob:
    return GPTJob(n_layer=S.n_layer, n_embd=S.n_embd, block_size=S.block_size, batch_size=S.batch_size,
                  steps=S.steps, lr=S.lr, seed=S.seed)


TIMEOUT_S = None  # a valid STEPS may run long; hangs end at the process-group timeout


def predicted(n_params: int, strategy: str, world: int) -> dict:
    """labtools.memory.estimate for the same model: fp32 weights and gradients, AdamW, the strategy's ZeRO stage."""
    b = estimate(n_params, precision="fp32", optimizer="adamw", zero_stage=ZERO_STAGE[strategy], dp=world)
    return {"params": b.parts.get("weights", 0), "grads": b.parts.get("gradients", 0),
            "optimizer": b.parts.get("optimizer state", 0)}


# --- 1. what each rank holds ---------------------------------------------------------------------------------------

def run_sharding(S: Settings, world: int) -> list[dict]:
    return launch(ranks.sharding, world, job(S), desc=f"sharding × {world}", timeout_s=TIMEOUT_S)


def sharding_figure(results: dict[int, list[dict]]) -> go.Figure:
    worlds = list(results)
    fig = plots.subplots(1, len(worlds), [f"{w} ranks (rank 0)" for w in worlds], height=430,
                         legend=dict(orientation="h", y=-0.25))
    names = [s.split(":")[0] if ":" in s else s for s in STRATEGIES]
    names = [f"{n}{' bf16' if 'bf16' in s else ''}" for n, s in zip(names, STRATEGIES)]
    for col, w in enumerate(worlds, 1):
        r0 = results[w][0]
        for i, (key, label) in enumerate((("params", "parameters at rest"),
                                          ("held_after_forward", "parameters held fwd→bwd"),
                                          ("grads", "gradients"), ("optimizer", "optimizer state"))):
            fig.add_trace(go.Bar(x=names, y=[r0[s][key] / 2**10 for s in STRATEGIES], name=label,
                                 marker_color=plots.color(i), showlegend=col == 1), row=1, col=col)
    fig.update_yaxes(title_text="KiB on this rank", row=1, col=1)
    fig.update_layout(barmode="group")
    return fig


def prediction_table(results: dict[int, list[dict]]) -> go.Figure:
    rows = []
    for w, res in results.items():
        for s in STRATEGIES:
            if "bf16" in s:
                continue
            m = res[0][s]
            p = predicted(m["n_params"], s, w)
            held = "params held fwd→bwd" if ZERO_STAGE[s] == 2 else "params"
            measured_params = m["held_after_forward"] if ZERO_STAGE[s] == 2 else m["params"]
            rows.append((f"{w} ranks", s, f"{measured_params:,} / {p['params']:,}", f"{m['grads']:,} / {p['grads']:,}",
                         f"{m['optimizer']:,} / {p['optimizer']:,}", held))
    return plots.table(("", "strategy", "params: measured / predicted", "grads", "optimizer state", "params counted"),
                       rows, title="Rank 0's bytes, measured from its local tensors / labtools.memory.estimate",
                       row_height=34)


def sharding_findings(ledger: Ledger, shard: dict[int, list[dict]]) -> str:
    parts = []
    for w, res in shard.items():
        z3 = [r["ZeRO-3: fully_shard"] for r in res]
        n = z3[0]["n_params"]
        full = 4 * n
        worst = max(abs(r[k] - full / w) for r in z3 for k in ("params", "grads")) / (full / w)
        p = predicted(n, "ZeRO-3: fully_shard", w)
        z1 = [r["ZeRO-1: DDP + ZeroRedundancyOptimizer"] for r in res]
        ledger.add(f"z3_1overN_{w}", f"{w} ranks, fully_shard: each rank holds 1/N of parameters and gradients "
                   "(worst relative deviation over ranks: padding)", worst, at_most(0.05), kind="measured")
        ledger.add(f"z3_sum_{w}", f"… and the shards add up to the whole model ({w} ranks)",
                   sum(r["params"] for r in z3) == full, is_true(), kind="measured")
        ledger.add(f"z3_opt_{w}", f"… and 1/N of AdamW's state: 2 × its parameter shard ({w} ranks)",
                   all(r["optimizer"] == 2 * r["params"] for r in z3), is_true(), kind="measured")
        ledger.add(f"z3_pred_{w}", f"Per-rank bytes equal labtools.memory's ZeRO-3 prediction (worst relative gap, "
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
        d, r0z3 = res[0][STRATEGIES[0]], z3[0]
        parts.append(f"With {w} ranks, rank 0 holds {r0z3['params'] / d['params']:.3f} of the parameters, "
                     f"{r0z3['grads'] / d['grads']:.3f} of the gradients and {r0z3['optimizer'] / d['optimizer']:.3f} "
                     f"of the optimizer state that DDP holds (1/N = {1 / w:.3f}). ZeRO-1's optimizer partitions are "
                     f"{', '.join(f'{x:.3f}' for x in shares)} × the even share: ZeroRedundancyOptimizer assigns "
                     "whole parameters to ranks (largest first, to the least-loaded rank), so the split is only as "
                     "even as the parameters' sizes allow; FSDP2 splits every parameter itself, hence its exact 1/N.")
    w0 = min(shard)
    r0 = shard[w0][0]
    z2, z3 = r0["ZeRO-2: fully_shard, no reshard"], r0["ZeRO-3: fully_shard"]
    mp = r0["ZeRO-3: fully_shard + bf16 params"]
    ledger.add("reshard", "Without resharding, the whole unsharded model is held between forward and backward "
               "(held ÷ model bytes)", z2["held_after_forward"] / (4 * z2["n_params"]), approx(1.0, abs=1e-9),
               kind="measured")
    ledger.add("reshard_z3", "With it, only the shard (held ÷ model bytes × N)",
               z3["held_after_forward"] / (4 * z3["n_params"]) * w0, approx(1.0, rel=0.05), kind="measured")
    parts.append(f"Between forward and backward, resharding keeps {z3['held_after_forward']:,} bytes of parameters, "
                 f"not resharding {z2['held_after_forward']:,} (the whole model, unsharded, until backward). With bf16 "
                 f"parameters the all-gathers carry {mp['input_bytes'].get('all_gather_single', 0):,} bytes instead of "
                 f"{z3['input_bytes'].get('all_gather_single', 0):,}; the stored shards, gradients and optimizer state "
                 f"stay fp32 ({mp['params']:,} bytes of parameters) and gradients are reduced in fp32.")
    return " ".join(parts)


# --- 2. FSDP1 ------------------------------------------------------------------------------------------------------

def run_fsdp1(S: Settings, world: int = 2) -> list[dict]:
    return launch(ranks.fsdp1, world, job(S), desc=f"FSDP1 × {world}", timeout_s=TIMEOUT_S)


def fsdp1_findings(ledger: Ledger, f1: list[dict]) -> str:
    r0 = f1[0]
    ratio = r0["FULL_SHARD"]["params"] / r0["NO_SHARD"]["params"] * len(f1)
    ledger.add("fsdp1_full", "FSDP1 FULL_SHARD and SHARD_GRAD_OP hold 1/N of the parameters at rest, NO_SHARD all "
               "(FULL_SHARD ÷ NO_SHARD × N)", ratio, approx(1.0, rel=0.05), kind="measured")
    ledger.note("fsdp1_rank0", {k: v for k, v in r0.items() if k != "dist"})
    held = [f"{name}: parameters {d['params']:,}, gradients {d['grads']:,}" for name, d in r0.items() if name != "dist"]
    return "Rank 0's bytes with FSDP1 (" + "; ".join(held) + ")."


# --- 3. traffic ----------------------------------------------------------------------------------------------------

def traffic(world: int, strategy_result: dict, reduce_scatter: str = "ring") -> float:
    """Predicted bytes this rank sends for one step's collectives, from their counted inputs: an all-gather whose
    input is s bytes sends (N−1)·s; an all-reduce of M bytes 2(N−1)/N·M; broadcasts of partitions that add up to
    M (every rank calls each one), (N−1)/N·M on average; a reduce-scatter of M bytes (N−1)/N·M under a ring
    (NCCL), or — reduce_scatter="gloo" — as much as an all-reduce, 2(N−1)/N·M (gloo's, measured in lesson 10)."""
    N = world
    b = strategy_result["input_bytes"]
    rs = (N - 1) / N * (1 if reduce_scatter == "ring" else 2)
    return ((N - 1) * b.get("all_gather_single", 0) + (N - 1) * b.get("all_gather_into_tensor", 0)
            + rs * (b.get("reduce_scatter_single", 0) + b.get("reduce_scatter_tensor", 0))
            + 2 * (N - 1) / N * b.get("all_reduce", 0) + (N - 1) / N * b.get("broadcast", 0))


def traffic_ratios(shard: dict[int, list[dict]], world: int | None = None) -> tuple[int, dict[str, dict]]:
    """(world, {strategy: {"ring", "gloo": predicted ÷ DDP's, "wire": measured ÷ DDP's measured (None under NCCL),
    "wire_vs_gloo": measured ÷ gloo prediction}}) at `world` ranks (default: the largest)."""
    w = world or max(shard)
    r0 = shard[w][0]
    ddp = r0[STRATEGIES[0]]
    out = {}
    for s in STRATEGIES:
        wire = r0[s].get("wire_bytes")
        out[s] = {"ring": traffic(w, r0[s]) / traffic(w, ddp),
                  "gloo": traffic(w, r0[s], "gloo") / traffic(w, ddp, "gloo"),
                  "wire": wire / ddp["wire_bytes"] if wire is not None else None,
                  "wire_vs_ring": wire / w / traffic(w, r0[s]) if wire is not None else None,
                  "wire_vs_gloo": wire / w / traffic(w, r0[s], "gloo") if wire is not None else None}
    return w, out


def traffic_figure(shard: dict[int, list[dict]]) -> go.Figure:
    w, ratios = traffic_ratios(shard)
    series = {"predicted, ring collectives (NCCL)": [r["ring"] for r in ratios.values()],
              "predicted, gloo (reduce-scatter = all-reduce)": [r["gloo"] for r in ratios.values()]}
    if all(r["wire"] is not None for r in ratios.values()):
        series["measured on the wire (gloo, loopback)"] = [r["wire"] for r in ratios.values()]
    fig = plots.bars(list(STRATEGIES), series, title=f"Bytes per step, {w} ranks, ÷ DDP's", yaxis="× DDP")
    fig.update_traces(texttemplate="%{y:.2f}×")
    return fig


def traffic_findings(ledger: Ledger, shard: dict[int, list[dict]]) -> str:
    w, ratios = traffic_ratios(shard)
    rw = shard[w][0]
    z3, mp = rw["ZeRO-3: fully_shard"], rw["ZeRO-3: fully_shard + bf16 params"]
    Z1, Z2, Z3 = STRATEGIES[1], "ZeRO-2: fully_shard, no reshard", "ZeRO-3: fully_shard"
    ledger.add("traffic_z3", f"Under ring collectives ZeRO-3 sends 1.5× DDP's bytes per step ({w} ranks; predicted "
               "from the counted inputs of its collectives)", ratios[Z3]["ring"], approx(1.5, rel=0.02),
               kind="computed")
    ledger.add("traffic_z2", "… without resharding 1.0× (one all-gather saved; predicted)", ratios[Z2]["ring"],
               approx(1.0, rel=0.02), kind="computed")
    ledger.add("traffic_z1", "ZeroRedundancyOptimizer: DDP's all-reduce plus a broadcast of the updated partitions, "
               "1.5× (predicted)", ratios[Z1]["ring"], approx(1.5, rel=0.02), kind="computed")
    ledger.add("mp_allgather", "bf16 parameters halve the all-gathered bytes (bf16 ÷ fp32, counted)",
               mp["input_bytes"]["all_gather_single"] / z3["input_bytes"]["all_gather_single"], approx(0.5, abs=1e-9),
               kind="counted")
    ledger.add("mp_reduce_fp32", "… while gradients are still reduced in fp32 (reduce-scatter bytes unchanged, "
               "counted)", mp["input_bytes"]["reduce_scatter_single"] == z3["input_bytes"]["reduce_scatter_single"],
               is_true(), kind="counted")
    ledger.note("traffic_x_ddp", ratios)
    calls = z3["calls"]
    text = (f"Per step, DDP all-reduces every gradient once: 2(N−1)/N · M bytes sent per rank. ZeRO-3 all-gathers the "
            "parameters in forward, again in backward (they were freed), and reduce-scatters the gradients — "
            f"{calls.get('all_gather_single', 0)} all-gathers and {calls.get('reduce_scatter_single', 0)} "
            "reduce-scatters here, one per unit each time — for 3(N−1)/N · M under ring collectives: predicted "
            f"{ratios[Z3]['ring']:.2f}× DDP. Not resharding saves the backward all-gather: {ratios[Z2]['ring']:.2f}×. "
            "PyTorch's ZeRO-1 (ZeroRedundancyOptimizer) keeps DDP's all-reduce and adds a broadcast of each updated "
            f"partition from its owner: {ratios[Z1]['ring']:.2f}× (the ZeRO paper's own stage 1 reduce-scatters "
            "instead, for 1×).")
    if ratios[Z3]["wire"] is None:
        ledger.note("wire", "not measurable: NCCL traffic does not cross the loopback interface")
        return text + " (Bytes on the wire are measured only for gloo ranks on one machine.)"
    for world in sorted(shard):
        _, r = traffic_ratios(shard, world)
        ledger.add(f"wire_ddp_{world}", f"DDP's bytes on the wire ÷ the ring prediction ({world} ranks; measured on "
                   "the loopback interface, headers included)", r[STRATEGIES[0]]["wire_vs_ring"], approx(1.0, rel=0.05),
                   kind="measured")
        ledger.add(f"wire_z3_{world}", f"On gloo, ZeRO-3 put 2× DDP's bytes on the wire, not the ring's 1.5× ({world} "
                   "ranks, measured)", r[Z3]["wire"], approx(2.0, rel=0.08), kind="measured")
        ledger.add(f"wire_z2_{world}", f"… and ZeRO-2 1.5×, not 1.0× ({world} ranks, measured)", r[Z2]["wire"],
                   approx(1.5, rel=0.08), kind="measured")
        ledger.add(f"wire_gloo_{world}", f"Every strategy's wire bytes match the prediction once gloo's reduce-scatter "
                   f"is costed as an all-reduce ({world} ranks; worst |measured ÷ predicted − 1|)",
                   max(abs(x["wire_vs_gloo"] - 1) for x in r.values()), at_most(0.05), kind="measured")
    return text + (
        f" **On the wire it is different.** Read off the loopback interface around the same step ({w} gloo ranks on "
        f"this machine), ZeRO-3 sent {ratios[Z3]['wire']:.2f}× DDP's bytes and ZeRO-2 {ratios[Z2]['wire']:.2f}×: "
        "gloo's reduce-scatter sends as much as its all-reduce (lesson 10 measured it alone: 1.99× an all-gather), "
        "so on gloo sharding gradients costs twice a ring's reduce-scatter. Costing it that way predicts every "
        f"strategy to within {100 * max(abs(x['wire_vs_gloo'] - 1) for x in ratios.values()):.1f}% "
        "(headers included). The 1.5× is what NCCL's ring reduce-scatter gives on GPUs — a prediction, not measured "
        "here.")


# --- 4. FSDP ≡ DDP -------------------------------------------------------------------------------------------------

def run_equivalence(S: Settings, world: int = 2) -> list[dict]:
    return launch(ranks.equivalence, world, job(S), desc=f"FSDP vs DDP × {world}", timeout_s=TIMEOUT_S)


def equivalence_figure(eq: list[dict]) -> go.Figure:
    r0 = eq[0]
    fig = go.Figure([go.Scatter(y=r0["DDP_losses"], mode="lines", name="DDP", line=dict(width=4), opacity=0.4),
                     go.Scatter(y=r0["FSDP_losses"], mode="lines+markers", name="FSDP2 (ZeRO-3)",
                                line=dict(dash="dot"))])
    return plots.style(fig, "Training loss: FSDP vs DDP on the same data", "step", "loss")


def equivalence_findings(ledger: Ledger, eq: list[dict]) -> str:
    r0 = eq[0]
    grads = {name: max(r[f"{name}_grad_max_diff"] for r in eq) for name in ("DDP", "FSDP")}
    curve = max(abs(a - b) for a, b in zip(r0["FSDP_losses"], r0["DDP_losses"]))
    steps = len(r0["FSDP_losses"])
    ledger.add("fsdp_grads", "FSDP's first-step gradients equal one process on the whole batch (max |Δ| over ranks)",
               grads["FSDP"], at_most(1e-6), kind="measured")
    ledger.add("fsdp_curve", f"FSDP and DDP loss curves agree over {steps} steps (max |Δ loss|)", curve, at_most(0.01),
               kind="measured")
    return (f"First-step gradients against one process on the whole batch: DDP {grads['DDP']:.1e}, FSDP "
            f"{grads['FSDP']:.1e}. Over {steps} steps the two loss curves differ by at most {curve:.1e}.")
