"""Lesson 06 — the memory budget: from a tiny GPT to 405B, predicted and checked against measurement.

Experiments for notebooks/06_memory_budget.ipynb. Per-profile settings live in PROFILES.
"""

from dataclasses import dataclass

import ipywidgets as W
import plotly.graph_objects as go
import torch

from labtools import optim as O
from labtools import plan, plots
from labtools.claims import Ledger, approx, at_least, at_most, is_true
from labtools.device import pick_device
from labtools.memory import (architecture, cuda_peak_bytes, estimate, model_state_bytes, saved_activation_bytes)
from labtools.model import GPT, GPTConfig
from labtools.plan import MODELS, Layout
from labtools.profiles import check_range, resolve
from labtools.widgets import Exercise, Panel, answer_check

GB = 1e9


@dataclass(frozen=True)
class Settings:
    profile: str
    validation_shapes: tuple  # (n_layer, n_embd, n_head, vocab, T, B) of the small models measured
    seed: int = 0

    def __post_init__(self):
        check_range("SEED", self.seed, 0, 2**31 - 1, int)
        if not self.validation_shapes:
            raise ValueError("need at least one validation shape")


PROFILES = {
    "smoke": Settings("smoke", validation_shapes=((2, 64, 4, 96, 32, 4), (4, 32, 2, 96, 64, 2),
                                                  (3, 128, 8, 96, 16, 8))),
    "cpu": Settings("cpu", validation_shapes=((2, 64, 4, 96, 64, 8), (4, 128, 4, 96, 128, 8), (8, 128, 8, 96, 256, 4),
                                              (6, 256, 8, 96, 128, 4))),
    "gpu": Settings("gpu", validation_shapes=((4, 256, 8, 96, 256, 8), (12, 768, 12, 50257, 1024, 4),
                                              (24, 1024, 16, 50257, 1024, 2))),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def budget(preset: str, *, dp=1, tp=1, pp=1, offload=None, **kw):
    """The budget per GPU of a published model (labtools.plan.MODELS) under a layout: labtools.plan.memory_per_gpu."""
    return plan.memory_per_gpu(MODELS[preset], Layout(dp, tp, pp), offload=offload, **kw)


# --- 1. the calculator ------------------------------------------------------------------------------------------

PART_ORDER = ("weights", "gradients", "master weights", "optimizer state", "activations")


def budget_figure(preset, precision, optimizer, zero_stage, dp, tp, pp, offload, micro_batch, seq, checkpoint,
                  gpu_gb) -> go.Figure:
    b = budget(preset, precision=precision, optimizer=optimizer, zero_stage=zero_stage, dp=dp, tp=tp, pp=pp,
               offload=None if offload == "none" else offload, micro_batch=micro_batch, seq=seq, checkpoint=checkpoint)
    fig = go.Figure()
    for i, part in enumerate(PART_ORDER):
        fig.add_trace(go.Bar(x=["per GPU", "host (offloaded)"],
                             y=[b.parts.get(part, 0) / GB, b.cpu_parts.get(part, 0) / GB],
                             name=part, marker_color=plots.color(i),
                             texttemplate="%{y:.3g}", textposition="inside"))
    fits = b.total <= gpu_gb * GB
    fig.add_hline(y=gpu_gb, line=dict(color="red" if not fits else "green", dash="dash"),
                  annotation_text=f"{gpu_gb:g} GB GPU")
    plots.style(fig, f"{preset}: {b.total / GB:,.1f} GB per GPU — {'fits' if fits else 'does NOT fit'} "
                       f"({b.bytes_per_param():.2f} B/param of model states)", "", "GB (10⁹ bytes)", barmode="stack")
    return fig


def calculator_panel() -> Panel:
    style = {"description_width": "initial"}
    controls = {
        "preset": W.Dropdown(options=list(MODELS), value="7B", description="model", style=style),
        "precision": W.Dropdown(options=["bf16-mixed", "fp32", "bf16"], value="bf16-mixed", description="precision"),
        "optimizer": W.Dropdown(options=["adamw", "sgd", "momentum", "lion", "adafactor", "adam8bit"], value="adamw",
                                description="optimizer"),
        "zero_stage": W.IntSlider(value=0, min=0, max=3, description="ZeRO stage", style=style),
        "dp": W.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048], value=8,
                                description="data parallel", style=style),
        "tp": W.SelectionSlider(options=[1, 2, 4, 8], value=1, description="tensor parallel", style=style),
        "pp": W.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=1, description="pipeline", style=style),
        "offload": W.Dropdown(options=["none", "optimizer", "params", "all"], value="none", description="offload"),
        "micro_batch": W.IntSlider(value=1, min=1, max=32, description="micro-batch", style=style),
        "seq": W.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384, 32768], value=4096,
                                 description="sequence", style=style),
        "checkpoint": W.Dropdown(options=["none", "attn", "mlp", "block"], value="block", description="checkpointing"),
        "gpu_gb": W.Dropdown(options=[24, 40, 80, 141], value=80, description="GPU GB"),
    }
    return Panel(budget_figure, controls, debounce_ms=0, title="Memory budget per GPU")


# --- 2. the published tables, reproduced -----------------------------------------------------------------------

def _row(name, b) -> tuple:
    p = b.parts
    return (name, *(f"{p.get(k, 0) / GB:,.1f}" for k in PART_ORDER[:4]), f"{b.model_states / GB:,.1f}",
            f"{b.bytes_per_param():.1f}")


HEADER = ("", "weights", "gradients", "fp32 master", "optimizer", "model states (GB)", "bytes/param")


def table_7b() -> tuple[go.Figure, dict]:
    rows = {"fp32 + Adam": estimate(7_000_000_000, precision="fp32", optimizer="adam"),
            "bf16 mixed + AdamW": estimate(7_000_000_000, precision="bf16-mixed", optimizer="adamw")}
    return plots.table(HEADER, [_row(k, v) for k, v in rows.items()], title="7B parameters, one GPU"), rows


def table_7b_findings(ledger: Ledger, rows: dict) -> str:
    fp32, mixed = rows["fp32 + Adam"].total / GB, rows["bf16 mixed + AdamW"].total / GB
    ledger.add("7b_fp32", "7B, fp32 + Adam: 16 bytes/param = 112 GB (computed)", fp32, approx(112, abs=1e-9),
               source="seeds", kind="computed")
    ledger.add("7b_mixed", "7B, bf16 mixed + AdamW: also 16 bytes/param = 112 GB (mixed precision saves activations "
               "and time, not model states; computed)", mixed, approx(112, abs=1e-9), source="seeds", kind="computed")
    return f"Computed: fp32 + Adam {fp32:.0f} GB, bf16 mixed + AdamW {mixed:.0f} GB."


def table_70b() -> tuple[go.Figure, dict]:
    rows = {"DDP on 8 GPUs": estimate(70_000_000_000, dp=8),
            "FSDP FULL_SHARD on 8 GPUs": estimate(70_000_000_000, zero_stage="FULL_SHARD", dp=8)}
    return plots.table(HEADER, [_row(k, v) for k, v in rows.items()], title="70B, bf16 mixed + AdamW, per GPU"), rows


def table_70b_findings(ledger: Ledger, rows: dict) -> str:
    ddp, fsdp = rows["DDP on 8 GPUs"].total / GB, rows["FSDP FULL_SHARD on 8 GPUs"].total / GB
    ledger.add("70b_fsdp", "70B, FULL_SHARD on 8 GPUs: 140 GB per GPU of model states (computed)", fsdp,
               approx(140, abs=1e-9), source="seeds", kind="computed")
    ledger.add("70b_ddp", "70B, DDP on 8 GPUs: every GPU holds all 1120 GB (computed)", ddp, approx(1120, abs=1e-9),
               kind="computed")
    ledger.add("70b_fits", "… and even sharded, 140 GB does not fit an 80 GB GPU (computed)", fsdp > 80, is_true(),
               source="seeds state 140 GB/GPU without saying this", kind="computed")
    return f"Computed: DDP {ddp:,.0f} GB per GPU, FULL_SHARD {fsdp:,.0f} GB per GPU."


def table_zero(n_params: int = 7_500_000_000, dp: int = 64) -> tuple[go.Figure, dict]:
    """The ZeRO paper's Figure 1 example: Ψ = 7.5B, N_d = 64, mixed-precision Adam (K = 12)."""
    rows = {f"ZeRO-{z}": estimate(n_params, zero_stage=z, dp=dp) for z in range(4)}
    base = rows["ZeRO-0"].total
    body = [(k, f"{v.total / GB:.1f}", f"{base / v.total:.1f}×", f"{limit}") for (k, v), limit in
            zip(rows.items(), ("1×", "4× (N → ∞)", "8× (N → ∞)", f"N = {dp}×"))]
    fig = plots.table(("", f"per GPU (GB), N = {dp}", "reduction", "the '4× / 8× / N×' rule"), body,
                      title=f"ZeRO stages, Ψ = {n_params / 1e9:g}B, mixed-precision Adam")
    return fig, rows


def zero_reductions(dp: int) -> list[float]:
    base = estimate(10**9, zero_stage=0, dp=dp).total
    return [base / estimate(10**9, zero_stage=z, dp=dp).total for z in (1, 2, 3)]


def table_zero_findings(ledger: Ledger, rows: dict) -> str:
    at8, at4096 = zero_reductions(8), zero_reductions(4096)
    for z, want in zip(range(4), (120.0, 31.4, 16.6, 1.9)):
        ledger.add(f"zero_{z}", f"ZeRO paper, Ψ = 7.5B, N = 64: stage {z} = {want} GB per GPU (computed)",
                   round(rows[f"ZeRO-{z}"].total / GB, 1), approx(want, abs=1e-9),
                   source="Rajbhandari et al. 2020, Fig. 1", kind="computed")
    ledger.add("zero_4x_at_8", "'ZeRO-1 gives 4×' is the N → ∞ limit: at N = 8 it is 16/(4 + 12/8) (computed)",
               at8[0], approx(16 / 5.5, rel=1e-9), source="seeds: 4× / 8× / N×", kind="computed")
    ledger.add("zero_limits", "… and stages 1 and 2 approach 4× and 8× as N grows (N = 4096; computed)",
               max(abs(at4096[0] - 4) / 4, abs(at4096[1] - 8) / 8), at_most(0.01), kind="computed")
    return "Reductions at N = 8 (stages 1, 2, 3): " + ", ".join(f"{r:.2f}×" for r in at8) + "."


def table_conventions() -> tuple[go.Figure, dict]:
    rows, budgets = [], {}
    for name, grads, note in (("16", "param", "bf16 weights 2 + bf16 grads 2 + fp32 master 4 + Adam m, v 8 (the ZeRO "
                                              "paper's 2 + 2 + 12; Micikevicius et al. 2018)"),
                              ("18", "fp32", "gradients accumulated in fp32 (4) instead of bf16 (DeepSpeed's ZeRO-3 "
                                             "estimator: 18/N per GPU)"),
                              ("20", "param+fp32", "bf16 gradients and an fp32 copy for the optimizer (2 + 4): the "
                                                   "Ultra-Scale Playbook's 'fp32 grad accumulation', DeepSpeed's "
                                                   "ZeRO-2 estimator (4 + 16/N)")):
        b = budgets[name] = estimate(7_000_000_000, grads=grads)
        rows.append((name, f"{b.bytes_per_param():.0f}", f"{b.total / GB:.0f} GB", f"{b.total / 2**30:.1f} GiB", note))
    fig = plots.table(("quoted", "computed B/param", "7B in GB", "7B in GiB", "the convention behind it"), rows,
                      title="Bytes per parameter: three numbers, three conventions", row_height=56)
    return fig, budgets


def conventions_findings(ledger: Ledger, budgets: dict) -> str:
    per_param = [budgets[k].bytes_per_param() for k in ("16", "18", "20")]
    gib = budgets["16"].total / 2**30
    ledger.add("conventions", "16 / 18 / 20 bytes per parameter are three gradient conventions of the same "
               "mixed-precision Adam (computed)", per_param == [16, 18, 20], is_true(), source="seeds disagree",
               kind="computed")
    ledger.add("gib", "112 GB is 104.3 GiB (some tables mix the two; computed)", gib, approx(104.3, abs=0.05),
               kind="computed")
    return f"Computed: {', '.join(f'{b:.0f}' for b in per_param)} bytes/param; 7B at 16 bytes/param = {gib:.1f} GiB."


# --- 2b. what the source articles say, settled ---------------------------------------------------------------

def source_claims() -> dict:
    """Computed budgets behind four statements of the source articles (every number from estimate())."""
    mixed, fp32 = estimate(7_000_000_000), estimate(7_000_000_000, precision="fp32", optimizer="adam")
    zero1 = {n: estimate(70_000_000_000, zero_stage=1, dp=n).model_states for n in (8, 32, 64, 1024, 4096)}
    offload = {}
    for label, z in (("DDP", 0), ("ZeRO-1", 1), ("ZeRO-2", 2), ("ZeRO-3", 3)):
        on_gpu = estimate(7_000_000_000, zero_stage=z, dp=8).total
        offload[label] = {"none": on_gpu,
                          "optimizer": estimate(7_000_000_000, zero_stage=z, dp=8, offload="optimizer").total}
    return {"mixed": mixed, "fp32": fp32, "zero1_70b": zero1, "offload_7b_8gpu": offload}


def source_claims_figure(c: dict) -> go.Figure:
    rows = [(k, f"{v['none'] / GB:.2f}", f"{v['optimizer'] / GB:.2f}", f"{v['none'] / v['optimizer']:.2f}×")
            for k, v in c["offload_7b_8gpu"].items()]
    return plots.table(("7B on 8 GPUs", "per GPU (GB)", "optimizer + master offloaded (GB)", "GPU memory saved"),
                       rows, title="CPU offload of the optimizer: how much GPU memory it saves depends on the sharding")


def source_claims_findings(ledger: Ledger, c: dict) -> str:
    mixed, fp32 = c["mixed"], c["fp32"]
    without_master = mixed.bytes_per_param() * (1 - mixed.parts["master weights"] / mixed.model_states)
    ledger.add("articles_12_bytes", "'bf16 weights + fp32 optimizer = 12 bytes/param, 0.75× of fp32' leaves out the "
               "fp32 master copy: with it, mixed-precision AdamW keeps 16 bytes/param, 1.0× fp32 + Adam's (ratio)",
               mixed.model_states / fp32.model_states, approx(1.0, rel=1e-9), source="a source article (12, 0.75×)",
               kind="computed")
    ledger.add("articles_12_is_16_minus_master", "… its 12 is exactly 16 − the 4-byte master copy (bytes/param "
               "without it)", without_master, approx(12.0, rel=1e-9), kind="computed")
    fp32_states = (mixed.parts["master weights"] + mixed.parts["optimizer state"]) / GB
    ledger.add("articles_7b_84", "Another article's 7B breakdown 14 + 14 + 84 + 16 GB is consistent: its 84 GB is "
               "master + m + v = 12 bytes/param of fp32 state (GB)", fp32_states, approx(84.0, rel=1e-9),
               source="a source article", kind="computed")
    z1 = c["zero1_70b"]
    ledger.add("articles_70b_zero1", "'70B would need 32+ GPUs with ZeRO-1' — no number of GPUs fits: ZeRO-1 keeps "
               "the whole bf16 weights and gradients on every GPU, ≥ 280 GB (per-GPU model states at N = 4096, GB)",
               z1[4096] / GB, at_least(280.0), source="a source article", kind="computed")
    off = c["offload_7b_8gpu"]
    saved = {k: v["none"] / v["optimizer"] for k, v in off.items()}
    ledger.add("articles_offload_ddp", "'CPU offloading: 4–8× less GPU memory' holds unsharded: offloading AdamW's "
               "state and master copy takes DDP from 16 to 4 bytes/param (ratio)", saved["DDP"], approx(4.0, rel=1e-9),
               source="a source article (4–8×, 20–50% overhead)", kind="computed")
    ledger.add("articles_offload_zero2", "… but once ZeRO has sharded that state, offloading it saves far less "
               "(ZeRO-2 on 8 GPUs, ratio)", saved["ZeRO-2"], at_most(2.0), kind="computed")
    ledger.note("offload_saved", saved)
    return ("Four statements of the source articles, settled by the same `estimate()`:\n\n"
            f"* **\"12 bytes/param, 0.75×\"**: bf16 weights (2) + bf16 gradients (2) + fp32 m and v (8) = "
            f"{without_master:.0f} — but mixed precision also keeps an fp32 master copy (4), so the total is "
            f"{mixed.bytes_per_param():.0f} bytes/param, exactly fp32 + Adam's {fp32.bytes_per_param():.0f} (ratio "
            f"{mixed.model_states / fp32.model_states:.2f}, not 0.75). Mixed precision saves activations and time, "
            "not model states.\n"
            f"* **7B = 14 + 14 + 84 + 16 GB** (another article) is right: master + m + v come to {fp32_states:.0f} GB "
            "(computed), 12 bytes/param *including* the master copy — the two articles count the same thing "
            "differently.\n"
            f"* **\"70B would need 32+ GPUs with ZeRO-1\"**: ZeRO-1 shards only the optimizer state and master "
            f"copy; the bf16 weights and gradients (4 bytes/param = 280 GB) stay whole on every GPU. Per GPU: "
            + ", ".join(f"N = {n}: {v / GB:,.0f} GB" for n, v in z1.items())
            + " — it never drops under 80 GB. 70B needs ZeRO-3/FSDP (or TP/PP), not more ZeRO-1 GPUs.\n"
            "* **\"CPU offloading: 4–8× less GPU memory\"**: offloading the optimizer state and master copy saves "
            + ", ".join(f"{k} {v:.2f}×" for k, v in saved.items())
            + " on 8 GPUs (table). 4× is the unsharded (or fully sharded) case; 8× needs the gradients offloaded too; "
            "with ZeRO-1/2 the offloaded state was already divided by N. The \"20–50% overhead\" is a time claim "
            "about PCIe transfers and a CPU Adam step: it needs a GPU to measure and is not measured here.")


# --- 3. validation on real models -------------------------------------------------------------------------------

VALIDATION_OPTIMIZERS = {"sgd": lambda p: O.SGD(p, lr=0.1), "momentum": lambda p: O.SGD(p, lr=0.1, momentum=0.9),
                         "adam": lambda p: O.Adam(p), "adamw": lambda p: O.AdamW(p, weight_decay=0.1),
                         "lion": lambda p: O.Lion(p), "adafactor": lambda p: O.Adafactor(p)}


def _model(shape, seed: int) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    L, C, H, V, T, B = shape
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=H, n_embd=C)).to(pick_device())
    g = torch.Generator().manual_seed(seed)
    X, Y = (torch.randint(V, (B, T), generator=g).to(pick_device()) for _ in range(2))
    return model, X, Y


def validate_states(S: Settings) -> list[dict]:
    """Per shape × optimizer: measured parameter, gradient and optimizer bytes after a step vs predicted."""
    out = []
    for shape in S.validation_shapes:
        arch = architecture(*shape)
        for name, make in VALIDATION_OPTIMIZERS.items():
            model, X, Y = _model(shape, S.seed)
            opt = make(model.parameters())
            model(X, Y)[1].backward()
            opt.step()
            m = model_state_bytes(model, opt)
            b = estimate(arch.n_params, precision="fp32", optimizer=name, param_shapes=arch.param_shapes)
            p = {"params": b.parts.get("weights", 0), "grads": b.parts.get("gradients", 0),
                 "optimizer": b.parts.get("optimizer state", 0)}
            out.append({"shape": shape, "optimizer": name, "measured": m, "predicted": p})
    return out


def validate_activations(S: Settings) -> list[dict]:
    """Per shape: saved-activation bytes measured (and, on CUDA, the allocator's peak of a forward) vs predicted."""
    out = []
    for shape in S.validation_shapes:
        model, X, Y = _model(shape, S.seed)
        row = {"shape": shape, "measured": saved_activation_bytes(model, X, Y),
               "predicted": architecture(*shape, bytes_per_element=4).activations["total"]}
        if X.is_cuda:
            row["cuda_forward_peak"] = cuda_peak_bytes(lambda: model(X, Y))
        out.append(row)
    return out


def validation_figure(states: list[dict], acts: list[dict]) -> go.Figure:
    rows = [(f"L{s[0]} C{s[1]} T{s[4]} B{s[5]}", r["optimizer"], f"{sum(r['measured'].values()):,}",
             f"{sum(r['predicted'].values()):,}", "exact" if r["measured"] == r["predicted"] else "DIFFERS")
            for r in states for s in [r["shape"]]]
    rows += [(f"L{s[0]} C{s[1]} T{s[4]} B{s[5]}", "activations", f"{r['measured']:,}", f"{r['predicted']:,}",
              f"{(r['predicted'] - r['measured']) / r['measured']:+.2%}") for r in acts for s in [r["shape"]]]
    return plots.table(("model", "what", "measured bytes", "predicted bytes", "agreement"), rows,
                       title="Prediction vs measurement on real models (fp32)")


def validation_findings(ledger: Ledger, states: list[dict], acts: list[dict]) -> str:
    exact = sum(r["measured"] == r["predicted"] for r in states)
    worst = max(abs(r["predicted"] - r["measured"]) / r["measured"] for r in acts)
    ledger.add("states_exact", f"Predicted parameter, gradient and optimizer bytes equal measured, exactly "
               f"({len(states)} model × optimizer pairs; measured from the tensors)", exact == len(states), is_true(),
               kind="measured")
    cpu = pick_device().type == "cpu"
    if cpu:  # fp32 on the CPU: the saved tensors are exactly the ones the formula lists
        ledger.add("acts_exact", "Predicted activation bytes equal measured, exactly (CPU, fp32; saved tensors "
                   "measured; worst gap)", worst, at_most(0.0), kind="measured")
    else:  # GPU attention kernels keep their own extra statistics
        ledger.add("acts_10pct", "Predicted activation bytes within 10% of measured (GPU kernels; worst)", worst,
                   at_most(0.10), kind="measured")
    return (f"Model states: {exact} of {len(states)} model × optimizer pairs predicted to the byte. Activations: "
            f"worst gap {worst:.2%} over {len(acts)} shapes.")


# --- 4. exercises -------------------------------------------------------------------------------------------------

def ex_zero_answers() -> dict:
    return {f"z{z}": estimate(7_000_000_000, zero_stage=z, dp=4).total / GB for z in range(4)}


def ex_allreduce_answers(n: int = 256, params: float = 70e9, link_gbps: float = 100, alpha: float = 10e-6) -> dict:
    M = 2 * params               # bf16 gradients, bytes
    beta = link_gbps * 1e9 / 8   # bytes per second
    return {"volume_gb": plan.collective_bytes("all_reduce", M, n) / GB,
            "seconds": plan.collective_time("all_reduce", M, n, bandwidth=beta, latency=alpha)}


def ex_pipeline_answers(P: int = 32) -> dict:
    return {f"m{M}": plan.pipeline_efficiency(P, M) for M in (8, 16, 32, 64)}


def ex_layout_check(answers: dict) -> tuple[bool, str]:
    tp, pp, dp, z = (int(answers.get(k, 0)) for k in ("tp", "pp", "dp", "zero"))
    if z not in (0, 1, 2, 3):
        return False, "ZeRO stage must be 0–3"
    model = MODELS["405B"]
    try:
        plan.check_layout(model, Layout(dp, tp, pp), world=2048, gpus_per_node=8)
    except ValueError as e:
        return False, str(e)
    note = (f" ({model.n_layer} layers do not split evenly into {pp} stages; the largest stage has "
            f"{-(-model.n_layer // pp)})") if model.n_layer % pp else ""
    b = budget("405B", zero_stage=z, dp=dp, tp=tp, pp=pp, micro_batch=1, seq=8192, checkpoint="block")
    fits = b.total <= 80 * GB
    return fits, (f"{b.total / GB:.1f} GB per GPU (model states {b.model_states / GB:.1f} GB, activations "
                  f"{b.parts.get('activations', 0) / GB:.1f} GB){note} — {'fits' if fits else 'does not fit'} 80 GB")


LAYOUT_SOLUTION = {"tp": 8, "pp": 16, "dp": 16, "zero": 1}


def exercises(ledger: Ledger) -> list[Exercise]:
    """The exercises; the ledger records that the layout of the last one's solution fits."""
    z = ex_zero_answers()
    ar = ex_allreduce_answers()
    pp = ex_pipeline_answers()
    fits, verdict = ex_layout_check(LAYOUT_SOLUTION)
    ledger.add("layout", "The 405B layout of the exercise's solution fits 80 GB (computed)", fits, is_true(),
               kind="computed")
    ledger.note("layout_solution", verdict)

    return [
        Exercise("ZeRO for 7B on 4 GPUs", "bf16 mixed precision with AdamW (16 bytes/param unsharded). What does one "
                 "GPU hold, in GB, for model states under ZeRO stages 0, 1, 2 and 3 with dp = 4?",
                 {f"z{s}": f"stage {s}" for s in range(4)}, answer_check(z),
                 "Stage 0: 2 + 2 + 12 = 16 B/param → **112 GB**. Stage 1 shards the 12 bytes of fp32 master + Adam "
                 f"state: 2 + 2 + 12/4 = 7 → **{z['z1']:.1f} GB**. Stage 2 also the gradients: 2 + 14/4 = 5.5 → "
                 f"**{z['z2']:.1f} GB**. Stage 3 everything: 16/4 = 4 → **{z['z3']:.1f} GB**."),
        Exercise("A 70B all-reduce", "Data parallelism over 256 GPUs, bf16 gradients, a ring all-reduce over a "
                 "100 Gb/s link per GPU with α = 10 µs per step. How many GB does each GPU send, and how many seconds "
                 "does the all-reduce take (time = 2(N−1)·α + volume / bandwidth)?",
                 {"volume_gb": "GB sent per GPU", "seconds": "seconds"}, answer_check(ar),
                 "M = 70e9 × 2 B = 140 GB. Ring all-reduce sends 2(N−1)/N · M = 2 · 255/256 · 140 = "
                 f"**{ar['volume_gb']:.1f} GB** per GPU. At 100 Gb/s = 12.5 GB/s that is {ar['volume_gb'] / 12.5:.2f} "
                 f"s, plus 2 · 255 · 10 µs = 5.1 ms of latency: **{ar['seconds']:.2f} s** — every step, unless "
                 "overlapped with backward or sharded (lesson 08)."),
        Exercise("Pipeline efficiency", "A pipeline of P = 32 stages runs M micro-batches per step (GPipe or 1F1B). "
                 "What fraction of the time is useful work, 1 − (P−1)/(M+P−1), for M = 8, 16, 32 and 64?",
                 {f"m{M}": f"M = {M}" for M in (8, 16, 32, 64)}, answer_check(pp),
                 "Bubble = (P−1)/(M+P−1): " + ", ".join(f"M = {M}: efficiency **{pp[f'm{M}']:.1%}**"
                                                         for M in (8, 16, 32, 64))
                 + ". Deep pipelines need many micro-batches, hence large global batches."),
        Exercise("405B on 2048 GPUs", "Choose tensor, pipeline and data parallel degrees (tp × pp × dp = 2048, tp ≤ 8) "
                 "and a ZeRO stage so that bf16 mixed-precision AdamW training of a 405B model fits 80 GB GPUs "
                 "(sequence 8192, micro-batch 1, every block checkpointed). The calculator judges your layout.",
                 {"tp": "tp", "pp": "pp", "dp": "dp", "zero": "ZeRO stage"}, ex_layout_check,
                 "One layout that fits: **tp = 8** (inside a node), **pp = 16**, **dp = 16**, **ZeRO-1**: "
                 + verdict
                 + ". Meta trained Llama 3.1 405B with tp 8 and pp 16 (and context parallelism for long sequences).")]


def calculator_findings(ledger: Ledger, redraw_ms: float) -> str:
    ledger.note("calculator_redraw_ms", redraw_ms)
    return f"Redraw time, measured here (kernel side, median): {redraw_ms:.0f} ms."
