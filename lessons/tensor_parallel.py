"""Lesson 10 — tensor and sequence parallelism with DTensor, dp × tp, and a 3-D planner that reproduces real runs.

The notebook side of notebooks/10_tensor_parallel.ipynb: settings, launches, figures, findings, the planner panel
and exercises. Rank functions: lessons/ranks/tensor_parallel.py; the split itself: labtools/dist/tensor.py;
the planner: labtools/plan.py.
"""

import dataclasses
from dataclasses import dataclass

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Ledger, approx, at_least, at_most, is_true
from labtools.dist import launch
from labtools.memory import activation_bytes, korthikanti_tp_bytes_per_layer
from labtools.plan import CLUSTERS, MODELS, Layout, bubble_fraction, rank_layouts, step_time, training_days
from labtools.profiles import check_range, resolve
from labtools.widgets import Exercise, Panel, answer_check
from lessons.ranks import tensor_parallel as ranks
from lessons.ranks.tensor_parallel import TPJob

GB = 1e9
A100, H100 = CLUSTERS["A100 80GB, NVLink 3, HDR 200 Gb/s"], CLUSTERS["H100 80GB, NVLink 4, NDR 400 Gb/s"]
CURVE_WINDOW = 10  # steps held equal: this small, unclipped run amplifies last-bit differences within ~20 steps


@dataclass(frozen=True)
class Settings:
    profile: str
    n_layer: int
    n_embd: int
    n_head: int
    block_size: int
    batch_size: int       # sequences per step (each tensor-parallel group sees all of them)
    steps: int            # AdamW steps of the dp × tp run
    worlds: tuple         # tensor-parallel sizes launched
    lr: float = 3e-3
    seed: int = 0

    def __post_init__(self):
        check_range("BATCH_SIZE", self.batch_size, 2, 256, int)
        check_range("STEPS", self.steps, 1, 10_000, int)
        check_range("SEED", self.seed, 0, 2**31 - 1, int)
        if self.batch_size % 2:
            raise ValueError(f"BATCH_SIZE must be even (dp = 2 splits it), got {self.batch_size}")
        for t in self.worlds:
            if self.n_head % t or self.n_embd % t:
                raise ValueError(f"tp = {t} must divide n_head ({self.n_head}) and n_embd ({self.n_embd})")


PROFILES = {
    "smoke": Settings("smoke", n_layer=2, n_embd=64, n_head=8, block_size=64, batch_size=4, steps=5, worlds=(2, 4)),
    "cpu": Settings("cpu", n_layer=4, n_embd=128, n_head=8, block_size=64, batch_size=8, steps=40, worlds=(2, 4)),
    "gpu": Settings("gpu", n_layer=6, n_embd=384, n_head=8, block_size=256, batch_size=16, steps=100, worlds=(2, 4)),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def job(S: Settings, **changes) -> TPJob:
    fields = dict(n_layer=S.n_layer, n_embd=S.n_embd, n_head=S.n_head, block_size=S.block_size,
                  batch_size=S.batch_size, steps=S.steps, lr=S.lr, seed=S.seed)
    return TPJob(**(fields | changes))


def run(S: Settings) -> dict:
    """A launch per tensor-parallel size (parity, collectives, memory), then dp 2 × tp 2 on 4 ranks against one
    process (the reference runs here, in the notebook's process)."""
    out = {t: launch(ranks.lesson_run, t, job(S), desc=f"tensor parallel × {t}", timeout_s=None) for t in S.worlds}
    two_d = launch(ranks.two_d, 4, job(S, dp=2), desc="dp 2 × tp 2", timeout_s=None)
    return {"tp": out, "two_d": two_d[0], "single": ranks.single_process(job(S, dp=2))}


# --- 1-2. parity -----------------------------------------------------------------------------------------------------

def parity_table(res: dict) -> go.Figure:
    rows = []
    for t, r in res["tp"].items():
        p = r[0]["parity"]
        rows += [(f"tp = {t}", part, f"{p[part]['written-out']:.1e}", f"{p[part]['dtensor']:.1e}", "—")
                 for part in ("mlp", "attention")]
        rows.append((f"tp = {t}", "whole GPT", f"{p['gpt']['written-out']:.1e}", f"{p['gpt']['dtensor']:.1e}",
                     f"{p['gpt']['dtensor+sp']:.1e}"))
    return plots.table(("", "module", "written out (f, g)", "DTensor TP", "DTensor TP + SP"), rows,
                       title="Max |Δ| of outputs and gradients against the same module on one rank (fp32)")


def parity_findings(ledger: Ledger, res: dict) -> str:
    parts = []
    for t, r in res["tp"].items():
        worst = max(v for x in r for part in x["parity"].values() for v in part.values())
        backend = r[0]["dist"]["backend"]
        ledger.add(f"parity_{t}", f"tp = {t}: MLP, attention and the whole GPT — written out, DTensor, DTensor + SP — "
                   "give one rank's outputs and gradients (max |Δ| over ranks, fp32, measured)", worst, at_most(1e-5),
                   kind="measured")
        parts.append(f"tp = {t} ({backend}): worst difference {worst:.1e}.")
    return " ".join(parts) + " The split computes the same function; only where the numbers live changes."


# --- 3. communication ------------------------------------------------------------------------------------------------

def ring_bytes(S: Settings, t: int, sequence_parallel: bool) -> float:
    """Predicted bytes on the wire for one forward + backward, all ranks together, ring algorithms: per layer 4
    all-reduces of b·s·h (2(t−1)/t each per rank), or 4 all-gathers and 4 reduce-scatters ((t−1)/t each) — the
    same 8(t−1)/t·b·s·h per layer and rank; sequence parallelism adds the gather before ln_f and its
    backward."""
    bsh = S.batch_size * S.block_size * S.n_embd * 4
    per_rank = S.n_layer * 8 * (t - 1) / t * bsh + (2 * (t - 1) / t * bsh if sequence_parallel else 0)
    return t * per_rank


def comm_table(res: dict, S: Settings) -> go.Figure:
    rows = []
    for t, r in res["tp"].items():
        c = r[0]["comm"]
        for variant, sp in (("written-out", False), ("dtensor", False), ("dtensor+sp", True)):
            calls = ", ".join(f"{n} × {k}" for n, k in sorted(c[variant]["calls"].items()))
            wire = c[variant]["wire"]
            rows.append((f"tp = {t}", variant, calls, f"{ring_bytes(S, t, sp):,.0f}",
                         "—" if wire is None else f"{wire:,}"))
    return plots.table(("", "version", "collectives counted (one forward + backward)", "predicted bytes (ring)",
                        "bytes on the wire (loopback)"), rows, row_height=34,
                       title=f"What tensor parallelism sends: {S.n_layer} layers, b·s·h = "
                             f"{S.batch_size}·{S.block_size}·{S.n_embd}")


def module_table(res: dict) -> go.Figure:
    """Which module of block 0 issues which collective (DTensor's CommDebugMode), TP and TP + SP, at the smallest tp."""
    t = min(res["tp"])
    c = res["tp"][t][0]["comm"]
    rows = []
    for variant in ("dtensor", "dtensor+sp"):
        for fqn, d in c[variant]["per_module"].items():
            if ".h.0." in fqn or fqn.endswith(".h.0") or fqn.endswith("ln_f"):
                fmt = lambda x: ", ".join(f"{k} × {n}" for k, n in x.items()) or "—"  # noqa: E731
                if d["forward"] or d["backward"]:
                    rows.append((variant, fqn.split("transformer.")[-1], fmt(d["forward"]), fmt(d["backward"])))
    return plots.table(("version", "module", "forward", "backward"), rows, row_height=30,
                       title=f"Collectives by module, block 0 (tp = {t}; a parent counts its children's too)")


def comm_findings(ledger: Ledger, res: dict, S: Settings) -> str:
    parts = []
    for t, r in res["tp"].items():
        c = r[0]["comm"]
        L = S.n_layer
        ledger.add(f"tp_calls_{t}", f"tp = {t}: TP all-reduces 4 times per layer per forward + backward (counted ÷ 4L)",
                   c["dtensor"]["calls"].get("all_reduce", 0) / (4 * L), approx(1.0, abs=1e-9), kind="counted")
        ledger.add(f"sp_calls_{t}", f"tp = {t}: TP + SP swaps each for a reduce-scatter and an all-gather (4L of each, "
                   "plus the gather before ln_f and its backward)",
                   c["dtensor+sp"]["calls"].get("reduce_scatter_tensor", 0) == 4 * L
                   and c["dtensor+sp"]["calls"].get("all_gather_into_tensor", 0) == 4 * L + 2, is_true(),
                   kind="counted")
        wire = c["dtensor"]["wire"]
        if wire is None:
            continue
        M = c["bsh_bytes"]
        rs_factor = c["wire_reduce_scatter"] / c["wire_all_gather"]
        ledger.add(f"tp_wire_{t}", f"tp = {t}: TP's bytes on the wire ÷ the ring prediction 8(t−1)·L·b·s·h (measured; "
                   "gloo's own all-reduce and headers add a little)", wire / ring_bytes(S, t, False),
                   approx(1.0, rel=0.15), kind="measured")
        ledger.add(f"gloo_rs_{t}", f"tp = {t}: gloo's reduce-scatter puts about twice an all-gather's bytes on the "
                   "wire — as much as its all-reduce (measured, a collective of b·s·h alone, mean of 10; the ring's "
                   "would be equal)",
                   rs_factor, approx(2.0, rel=0.15), kind="measured")
        sp_wire = c["dtensor+sp"]["wire"]
        ring_sp = ring_bytes(S, t, True)
        gloo_sp = ring_sp + 4 * L * (c["wire_reduce_scatter"] - c["wire_all_gather"])  # each RS costs an AR on gloo
        ledger.add(f"sp_wire_{t}", f"tp = {t}: TP + SP on the wire ÷ the ring prediction with gloo's measured "
                   "reduce-scatter cost", sp_wire / gloo_sp, approx(1.0, rel=0.15), kind="measured")
        parts.append(f"tp = {t}: TP sent {wire:,} bytes ({wire / ring_bytes(S, t, False):.2f}× the ring prediction), "
                     f"TP + SP {sp_wire:,} ({sp_wire / ring_sp:.2f}× its ring prediction of {ring_sp:,.0f}). One "
                     f"collective of {M:,} bytes alone: all-reduce {c['wire_all_reduce']:,}, all-gather "
                     f"{c['wire_all_gather']:,}, reduce-scatter {c['wire_reduce_scatter']:,} bytes on the wire.")
    return (" ".join(parts) + " Under ring algorithms (NCCL's) TP and TP + SP move the same volume; on gloo a "
            "reduce-scatter costs what an all-reduce does, so sequence parallelism sends more here — measured, "
            "not assumed. What SP buys is memory (next section).")


# --- 4. activation memory ---------------------------------------------------------------------------------------------

def memory_rows(res: dict, S: Settings) -> list[tuple]:
    from labtools import data
    V = data.text().vocab_size
    rows = []
    for t, r in res["tp"].items():
        measured = r[0]["memory"]
        for variant, tp, sp in (("none", 1, False), ("tp", t, False), ("tp+sp", t, True)):
            pred = activation_bytes(S.n_layer, S.n_embd, S.n_head, V, S.block_size, S.batch_size, tp=tp,
                                    sequence_parallel=sp)["total"]
            rows.append((t, variant, measured[variant], pred))
    return rows


def memory_figure(rows: list[tuple]) -> go.Figure:
    fig = go.Figure()
    for i, variant in enumerate(("none", "tp", "tp+sp")):
        sel = [r for r in rows if r[1] == variant]
        fig.add_trace(go.Bar(x=[f"tp = {r[0]}" for r in sel], y=[r[2] / 2**20 for r in sel],
                             name=f"{variant}, measured", marker_color=plots.color(i)))
        fig.add_trace(go.Scatter(x=[f"tp = {r[0]}" for r in sel], y=[r[3] / 2**20 for r in sel], mode="markers",
                                 name="predicted", showlegend=i == 0,
                                 marker=dict(color="black", symbol="line-ew-open", size=28, line=dict(width=3))))
    return plots.style(fig, "Activations saved for backward, per rank (one forward of the whole GPT)", "",
                       "MiB", barmode="group")


def memory_findings(ledger: Ledger, rows: list[tuple], S: Settings) -> str:
    exact = all(measured == pred for _, _, measured, pred in rows)
    ledger.add("mem_exact", f"Activation bytes per rank equal labtools.memory's prediction exactly: none, TP, TP + SP "
               f"at tp = {', '.join(str(t) for t in S.worlds)} (measured vs predicted, fp32)", exact, is_true(),
               kind="measured")
    s, b, h, a = S.block_size, S.batch_size, S.n_embd, S.n_head
    k = {sp: {t: korthikanti_tp_bytes_per_layer(s, b, h, a, t, sp) / (s * b * h) for t in S.worlds}
         for sp in (False, True)}
    t = max(S.worlds)
    ours = {sp: (2 + 14 / t if sp else 4 + 12 / t) for sp in (False, True)}
    return (f"Measured equals predicted for every case. Per layer, in units of b·s·h: our block keeps 16 without "
            f"tensor parallelism, 4 + 12/t with it (the LayerNorms' and the column-parallel linears' inputs stay "
            f"whole: {ours[False]:.1f} at t = {t}), and 2 + 14/t with sequence parallelism ({ours[True]:.1f}): "
            f"DTensor keeps the all-gathered inputs of c_attn and c_fc for their backward. Korthikanti et al.'s "
            f"formulas (fp16, dropout masks, the s×s scores kept) give {k[False][t]:.1f} and {k[True][t]:.1f} at "
            f"t = {t}: Megatron-LM gathers those inputs again in backward instead of keeping them, which is how "
            "it reaches 34/t — everything divided by t.")


# --- 5. dp × tp --------------------------------------------------------------------------------------------------

def two_d_figure(res: dict) -> go.Figure:
    fig = go.Figure([go.Scatter(y=res["single"]["losses"], name="one process", line=dict(width=5), opacity=0.35),
                     go.Scatter(y=res["two_d"]["losses"], name="dp 2 × tp 2 (FSDP2 × DTensor TP)", mode="lines+markers",
                                line=dict(dash="dot"))])
    return plots.style(fig, "Training loss: 2-D parallel on 4 ranks vs one process", "step", "loss")


def two_d_findings(ledger: Ledger, res: dict) -> str:
    import numpy as np
    diffs = [abs(a - b) for a, b in zip(res["two_d"]["losses"], res["single"]["losses"])]
    grads = max(float(np.abs(np.array(res["two_d"]["first_grads_ln_1"][k]) - np.array(v)).max())
                for k, v in res["single"]["first_grads_ln_1"].items())
    ledger.add("two_d_grads", "dp 2 × tp 2: first-step gradients (gathered) equal one process's (max |Δ| over the "
               "LayerNorm gains, measured)", grads, at_most(1e-6), kind="measured")
    ledger.add("two_d_curve", f"… and the first {min(len(diffs), CURVE_WINDOW)} AdamW steps' losses match (max |Δ|)",
               max(diffs[:CURVE_WINDOW]), at_most(1e-3), kind="measured")
    ledger.note("two_d_curve_whole_run", max(diffs))
    return (f"First-step gradients differ by {grads:.1e}; over the first {min(len(diffs), CURVE_WINDOW)} steps the "
            f"losses differ by at most {max(diffs[:CURVE_WINDOW]):.1e}, over all {len(diffs)} by {max(diffs):.1e} — "
            "the two runs add the same numbers in a different order, and an unclipped run at this learning rate "
            "amplifies last-bit differences into visibly different curves within a few tens of steps. The mesh: "
            "ranks 0–1 and 2–3 are the tensor-parallel groups, (0, 2) and (1, 3) the "
            "data-parallel ones — tensor parallelism innermost, where a real cluster's fast links are.")


# --- 6. the planner ---------------------------------------------------------------------------------------------------

def published_cases() -> dict:
    gpt3, llama = MODELS["GPT-3 175B"], MODELS["405B"]
    art = {z: step_time(gpt3, A100, Layout(8, 8, 16), 1536, zero_stage=z) for z in (0, 1)}
    ll = step_time(llama, H100, Layout(128, 8, 16), 2048, zero_stage=1)
    ll_v = {v: bubble_fraction(16, 16, v) for v in (1, 2, 4)}
    inter = step_time(gpt3, dataclasses.replace(A100, intra_bw=A100.inter_bw), Layout(8, 8, 16), 1536)
    return {"article": art, "llama": ll, "llama_v": ll_v, "days": training_days(175e9, 300e9, 1024, 140e12),
            "nvlink": art[1], "network": inter}


def cases_table(c: dict) -> go.Figure:
    a0, a1, ll = c["article"][0], c["article"][1], c["llama"]
    rows = [
        ("GPT-3 175B, 1024 A100s, TP 8 × PP 16 × DP 8, batch 1536", f"{a0.memory.total / GB:.1f} GB (no ZeRO), "
         f"{a1.memory.total / GB:.1f} GB (ZeRO-1)", f"m = {a1.micro_batches}: {a1.bubble:.1%}",
         f"{a1.step_s:.1f} s/step"),
        ("Llama 3 405B, 16,384 H100s, TP 8 × PP 16 × DP 128, 16 micro-batches", f"{ll.memory.total / GB:.1f} GB "
         "(ZeRO-1)", f"1F1B {c['llama_v'][1]:.1%}; interleaved v = 2: {c['llama_v'][2]:.1%}, v = 4: "
         f"{c['llama_v'][4]:.1%}", f"{ll.step_s:.1f} s/step"),
        ("GPT-3 175B on 300B tokens, 1024 A100s at 140 TFLOP/s each", "—", "—", f"{c['days']:.1f} days (8·T·P/(n·X))"),
    ]
    return plots.table(("published case", "memory per GPU (predicted)", "pipeline bubble", "time (predicted)"), rows,
                       row_height=44, title="Three published configurations, through the planner")


def cases_findings(ledger: Ledger, c: dict) -> str:
    a1, ll = c["article"][1], c["llama"]
    ledger.add("gpt3_fits", "GPT-3 175B as TP 8 × PP 16 × DP 8 fits 80 GB A100s (predicted memory per GPU, ZeRO-1, "
               "every layer recomputed)", a1.fits and c["article"][0].fits, is_true(), source="a source article",
               kind="computed")
    ledger.add("gpt3_bubble", "… and its bubble with batch 1536 and micro-batch 1 is 15/207 (computed)", a1.bubble,
               approx(15 / 207, rel=1e-9), kind="computed")
    ledger.add("llama_bubble", "Llama 3 405B, pp 16 with 16 micro-batches: non-interleaved 1F1B idles 15/31 ≈ 48% "
               "(computed)", ll.bubble, approx(15 / 31, rel=1e-9), source="Llama 3 paper, §3.3", kind="computed")
    ledger.add("gpt3_days", "GPT-3 175B on 300B tokens with 1024 A100s at 140 TFLOP/s: ≈ 34 days (computed, "
               "8·T·P/(n·X))",
               c["days"], approx(34, rel=0.02), source="Narayanan et al. 2021, §5.1", kind="computed")
    ratio = {k: c[k].tp_comm_s / c[k].compute_s for k in ("nvlink", "network")}
    ledger.add("tp_nvlink", "\"TP requires fast interconnect\": over NVLink, GPT-3's TP 8 all-reduces cost under "
               "10% of the compute time (predicted, TP comm ÷ compute)", ratio["nvlink"], at_most(0.10),
               source="a source article", kind="computed")
    ledger.add("tp_network", "… across nodes (HDR, 25 GB/s per GPU) at least half of it (predicted)", ratio["network"],
               at_least(0.5), kind="computed")
    return (f"Over NVLink the tensor-parallel all-reduces of GPT-3's layers cost {ratio['nvlink']:.1%} of the compute "
            f"time; the same TP 8 across nodes would cost {ratio['network']:.0%} — tensor parallelism stays inside a "
            f"node. Llama 3's pipeline without interleaving would idle {ll.bubble:.1%}; with v = 2 chunks per rank "
            f"{c['llama_v'][2]:.1%}, v = 4 {c['llama_v'][4]:.1%}.")


def planner_figure(model: str, gpus: int, batch: int, tp: int, pp: int, zero: int, cluster: str, top: int = 8):
    ranked = rank_layouts(MODELS[model], CLUSTERS[cluster], gpus, batch, zero_stage=zero)
    chosen = next((e for e in ranked if e.layout.tp == tp and e.layout.pp == pp), None)
    shown = ranked[:top] + ([chosen] if chosen is not None and chosen not in ranked[:top] else [])
    names = [f"{'→ ' if e is chosen else ''}{e.layout}{'' if e.fits else ' (does not fit)'}" for e in shown]
    fig = plots.subplots(1, 2, ("memory per GPU (GB)", "time per step (s)"), height=420, legend="top")
    fig.add_trace(go.Bar(y=names, x=[e.memory.total / GB for e in shown], orientation="h", showlegend=False,
                         marker_color=[plots.color(0) if e.fits else "#cf222e" for e in shown]), row=1, col=1)
    fig.add_vline(x=CLUSTERS[cluster].gpu_memory / GB, line=dict(dash="dash"), row=1, col=1)
    for i, part in enumerate(("compute", "bubble", "TP comm", "DP comm (exposed)", "PP comm")):
        fig.add_trace(go.Bar(y=names, x=[e.breakdown[part] for e in shown], orientation="h", name=part,
                             marker_color=plots.color(i + 1)), row=1, col=2)
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed")
    msg = (f"your layout dp {gpus // (tp * pp)} × tp {tp} × pp {pp}: "
           + (f"{chosen.step_s:.1f} s/step, {chosen.memory.total / GB:.1f} GB" if chosen else "not possible here"))
    fig.update_layout(title=f"{model} on {gpus:,} GPUs, batch {batch}: fastest layouts first — {msg}")
    return fig


def planner_panel() -> Panel:
    style = {"description_width": "initial"}
    controls = {
        "model": W.Dropdown(options=["GPT-3 175B", "405B", "70B", "7B"], value="GPT-3 175B", description="model"),
        "gpus": W.SelectionSlider(options=[64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384], value=1024,
                                  description="GPUs", style=style),
        "batch": W.SelectionSlider(options=[256, 512, 1024, 1536, 2048, 4096], value=1536,
                                   description="global batch (sequences)", style=style),
        "tp": W.SelectionSlider(options=[1, 2, 4, 8], value=8, description="your tp", style=style),
        "pp": W.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=16, description="your pp", style=style),
        "zero": W.IntSlider(value=1, min=0, max=3, description="ZeRO stage", style=style),
        "cluster": W.Dropdown(options=list(CLUSTERS), value=list(CLUSTERS)[0], description="cluster", style=style),
    }
    return Panel(planner_figure, controls, debounce_ms=0, title="The 3-D planner: memory and step time, ranked")


def exercises(ledger: Ledger) -> list[Exercise]:
    per_layer = 8 * (8 - 1) / 8 * 4 * 2048 * 12288 * 2 / GB  # 8(t−1)/t · b·s·h elements, bf16

    fits = {tp: step_time(MODELS["405B"], H100, Layout(1024 // (tp * 16), tp, 16), 1024) for tp in (1, 2, 4, 8)}
    smallest = next(tp for tp in (1, 2, 4, 8) if fits[tp].fits)
    ledger.note("exercise_405b_smallest_tp", smallest)
    return [
        Exercise("Bytes per layer", "GPT-3: h = 12288, sequence 2048, micro-batch 4, bf16 activations (2 bytes). With "
                 "tp = 8 under ring all-reduces, how many GB does each GPU send per layer for one forward and "
                 "backward: 8·(t−1)/t·b·s·h elements?", {"gb": "GB per layer"}, answer_check({"gb": per_layer}),
                 f"8 × 7/8 × 4·2048·12288 × 2 bytes = **{per_layer:.2f} GB** per layer and micro-batch — 96 layers "
                 "make that ~100 GB per micro-batch, which only NVLink carries fast enough."),
        Exercise("The smallest tp", "405B on 1024 H100s with pp = 16 and a batch of 1024 sequences of 8192 tokens "
                 "(ZeRO-1, every layer recomputed): what is the smallest tensor-parallel size (1, 2, 4 or 8) that "
                 "fits 80 GB? Try it in the planner.", {"tp": "tp"}, answer_check({"tp": smallest}),
                 f"**tp = {smallest}**: " + ", ".join(f"tp {t}: {e.memory.total / GB:.0f} GB"
                                                     for t, e in fits.items())
                 + ". With tp = 1 each GPU holds 405B/16 parameters' bf16 weights and gradients whole (ZeRO-1 shards "
                 "only the optimizer state): about 100 GB before anything else."),
    ]
