"""Lesson 08, section 3: bytes sent per step by DDP and by each sharding strategy."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_most, is_true
from lessons.fsdp_zero import STRATEGIES, Strategy


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
    ddp = r0[Strategy.DDP]
    out = {}
    for s in STRATEGIES:
        wire = r0[s].get("wire_bytes")
        out[s] = {"ring": traffic(w, r0[s]) / traffic(w, ddp),
                  "gloo": traffic(w, r0[s], "gloo") / traffic(w, ddp, "gloo"),
                  "wire": wire / ddp["wire_bytes"] if wire is not None else None,
                  "wire_vs_ring": wire / w / traffic(w, r0[s]) if wire is not None else None,
                  "wire_vs_gloo": wire / w / traffic(w, r0[s], "gloo") if wire is not None else None}
    return w, out


def figure(shard: dict[int, list[dict]]) -> go.Figure:
    w, ratios = traffic_ratios(shard)
    series = {"predicted, ring collectives (NCCL)": [r["ring"] for r in ratios.values()],
              "predicted, gloo (reduce-scatter = all-reduce)": [r["gloo"] for r in ratios.values()]}
    if all(r["wire"] is not None for r in ratios.values()):
        series["measured on the wire (gloo, loopback)"] = [r["wire"] for r in ratios.values()]
    fig = plots.bars([s.label for s in STRATEGIES], series, title=f"Bytes per step, {w} ranks, ÷ DDP's", yaxis="× DDP")
    fig.update_traces(texttemplate="%{y:.2f}×")
    return fig


def findings(ledger: Ledger, shard: dict[int, list[dict]]) -> Findings:
    w, ratios = traffic_ratios(shard)
    rw = shard[w][0]
    z3, mp = rw[Strategy.ZERO3], rw[Strategy.ZERO3_BF16]
    Z1, Z2, Z3 = Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3
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
    bullets = [
        f"ZeRO-3 called {calls.get('all_gather_single', 0)} all-gathers and {calls.get('reduce_scatter_single', 0)} "
        "reduce-scatters per step: one per unit in forward, again in backward, then one per unit for the gradients.",
        f"Under ring collectives that predicts **{ratios[Z3]['ring']:.2f}×** DDP's bytes for ZeRO-3, "
        f"{ratios[Z2]['ring']:.2f}× for ZeRO-2 (no backward all-gather) and {ratios[Z1]['ring']:.2f}× for "
        "ZeroRedundancyOptimizer (DDP's all-reduce plus a broadcast).",
    ]
    if ratios[Z3]["wire"] is None:
        ledger.note("wire", "not measurable: NCCL traffic does not cross the loopback interface")
        return Findings(bullets + ["Bytes on the wire are measured only for gloo ranks on one machine."])
    for world in sorted(shard):
        _, r = traffic_ratios(shard, world)
        ledger.add(f"wire_ddp_{world}", f"DDP's bytes on the wire ÷ the ring prediction ({world} ranks; measured on "
                   "the loopback interface, headers included)", r[Strategy.DDP]["wire_vs_ring"], approx(1.0, rel=0.05),
                   kind="measured")
        ledger.add(f"wire_z3_{world}", f"On gloo, ZeRO-3 put 2× DDP's bytes on the wire, not the ring's 1.5× ({world} "
                   "ranks, measured)", r[Z3]["wire"], approx(2.0, rel=0.08), kind="measured")
        ledger.add(f"wire_z2_{world}", f"… and ZeRO-2 1.5×, not 1.0× ({world} ranks, measured)", r[Z2]["wire"],
                   approx(1.5, rel=0.08), kind="measured")
        # The loopback counter also carries the headers and the notebook's own local traffic (in a browser, the
        # kernel's messages to JupyterLab): 2.6-3.2% under papermill, 5.1% once in the browser. A ring-costed
        # reduce-scatter would be 25% off for ZeRO-3, so 10% still tells the two apart.
        ledger.add(f"wire_gloo_{world}", f"Every strategy's wire bytes match the prediction within 10% once gloo's "
                   f"reduce-scatter is costed as an all-reduce ({world} ranks; worst |measured ÷ predicted − 1|)",
                   max(abs(x["wire_vs_gloo"] - 1) for x in r.values()), at_most(0.10), kind="measured")
    worst = 100 * max(abs(x["wire_vs_gloo"] - 1) for x in ratios.values())
    return Findings(bullets + [
        f"**On the wire** ({w} gloo ranks, loopback), ZeRO-3 sent **{ratios[Z3]['wire']:.2f}×** DDP's bytes and "
        f"ZeRO-2 {ratios[Z2]['wire']:.2f}×: gloo's reduce-scatter sends as much as its all-reduce.",
        f"Costing gloo's reduce-scatter as an all-reduce predicts every strategy's wire bytes to within "
        f"{worst:.1f}%, headers included.",
    ])
