"""Lesson 15, sections 2-3: an MoE GPT trained beside a dense GPT of the same active parameters and one of the same
total parameters; FLOPs per token counted; where the tokens go with and without the balancing loss."""

import dataclasses
import math
import statistics
import time
from dataclasses import replace

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
import torch
import torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from labtools import evidence, plots
from labtools.claims import Findings, Ledger, approx, at_least, at_most, in_words
from labtools.data import text
from labtools.controls import choice_slider
from labtools.device import pick_device
from labtools.model import GPT, GPTConfig
from labtools.moe import active_params, aux_losses, capacity, moe_gpt, moe_layers, route
from labtools.progress import progress
from labtools.widgets import Panel
from lessons.mixture_of_experts import Settings

RUNS = ("dense, same active", "MoE", "dense, same total")
BALANCE_RUNS = ("balancing loss on", "balancing loss off")


def config(S: Settings, vocab: int) -> GPTConfig:
    return GPTConfig(vocab_size=vocab, block_size=S.block_size, n_layer=S.n_layer, n_head=S.n_head,
                     n_embd=S.n_embd)


def widen(model: GPT, factor: int) -> GPT:
    """Every block's MLP made `factor` times wider (hidden 4·d·factor), initialised as GPT initialises: a dense
    model with as many parameters as an MoE of `factor` experts."""
    d, L = model.config.n_embd, model.config.n_layer
    for block in model.transformer.h:
        block.mlp.c_fc = nn.Linear(d, 4 * d * factor)
        block.mlp.c_proj = nn.Linear(4 * d * factor, d)
        model._init_weights(block.mlp.c_fc)
        nn.init.normal_(block.mlp.c_proj.weight, std=0.02 / math.sqrt(2 * L))
        nn.init.zeros_(block.mlp.c_proj.bias)
    return model


def build(S: Settings, name: str, vocab: int) -> GPT:
    torch.manual_seed(S.seed)
    cfg = config(S, vocab)
    if name == "dense, same active":  # an MLP k times wider: the FLOPs of the MoE's k experts per token
        return widen(GPT(cfg), S.top_k) if S.top_k > 1 else GPT(cfg)
    if name == "dense, same total":
        return widen(GPT(cfg), S.n_experts)
    return moe_gpt(cfg, S.n_experts, S.top_k, S.capacity_factor)


def flops_per_token(model: GPT, S: Settings) -> float:
    """Training FLOPs per token of one step, counted by FlopCounterMode (attention on the math backend, whose
    products the counter sees; lesson 12)."""
    g = torch.Generator().manual_seed(S.seed)
    X = torch.randint(model.config.vocab_size, (2, S.block_size), generator=g).to(pick_device())
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        _, loss = model(X, X)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / X.numel()


def formula_per_token(model: GPT) -> float:
    """6 × the matrix weights a token uses (its k experts' and the router's, not the other experts') + attention's
    12·L·s·d (lesson 12)."""
    c = model.config
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    for m in moe_layers(model):
        per_expert = sum(x.weight.numel() for x in m.experts[0].modules() if isinstance(x, nn.Linear))
        matmul -= (m.n_experts - m.top_k) * per_expert
    return 6 * matmul + 12 * c.n_layer * c.block_size * c.n_embd


def train(S: Settings, model: GPT, balance_weight: float, desc: str) -> dict:
    """AdamW on the text corpus, the same batches for every model; for an MoE, the loss adds balance_weight × the
    balancing loss and the load of every expert is kept step by step."""
    corpus, dev = text(), pick_device()
    model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=S.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(S.seed)
    layers = moe_layers(model)
    out = {"loss": [], "load": [], "dropped": [], "balance": []}
    start = time.perf_counter()
    for _ in progress(range(S.steps), desc=desc):
        X, Y = corpus.batch("train", S.batch_size, S.block_size, g, dev)
        _, loss = model(X, Y)
        total = loss
        if layers:
            aux = aux_losses(model)
            total = loss + balance_weight * aux["balance"]
            out["balance"].append(aux["balance"].item())
            out["load"].append([m.routing.load().tolist() for m in layers])
            out["dropped"].append(sum(m.routing.dropped() for m in layers) / sum(m.routing.expert.numel()
                                                                                   for m in layers))
        total.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["loss"].append(loss.item())
    out["seconds"] = time.perf_counter() - start
    out["val"] = evaluate(model, S, corpus)
    if layers:
        out["logits"] = router_logits(model, S, corpus)
    return out


@torch.no_grad()
def evaluate(model: GPT, S: Settings, corpus, batches: int = 4) -> float:
    g = torch.Generator().manual_seed(S.seed + 1)
    losses = [model(*corpus.batch("val", S.batch_size, S.block_size, g, pick_device()))[1].item()
              for _ in range(batches)]
    return statistics.mean(losses)


@torch.no_grad()
def router_logits(model: GPT, S: Settings, corpus) -> list[torch.Tensor]:
    """Each MoE layer's router logits for one validation batch: what the panel re-routes."""
    g = torch.Generator().manual_seed(S.seed + 2)
    model(*corpus.batch("val", S.batch_size, S.block_size, g, pick_device()))
    return [m.routing.logits.cpu() for m in moe_layers(model)]


def run(S: Settings) -> dict:
    """The three models of section 2 (the MoE with the lesson's balancing weight) and, for section 3, the same MoE
    without the balancing loss."""
    vocab = text().vocab_size
    res = {}
    for name in RUNS:
        model = build(S, name, vocab)
        res[name] = {"params": model.num_params(), "active": active_params(model),
                     "flops": flops_per_token(model, S), "formula": formula_per_token(model)}
        res[name] |= train(S, model, S.balance_weight, name)
    off = build(S, "MoE", vocab)
    res["no balance"] = train(S, off, 0.0, "MoE without the balancing loss")
    return res


COMPARED = ("dense, same active", "MoE")


def over_seeds(S: Settings, res: dict) -> tuple[list[float], list[float]] | None:
    """(the dense model's final validation losses, the MoE's) over S.seeds seeds, this run's first: each seed sets
    both models' initial weights and their batches. None for one seed."""
    if S.seeds < 2:
        return None
    vocab = text().vocab_size
    out = {name: [res[name]["val"]] for name in COMPARED}
    for k in range(1, S.seeds):
        other = replace(S, seed=S.seed + k)
        for name in COMPARED:
            out[name].append(train(other, build(other, name, vocab), other.balance_weight,
                                   f"{name}, seed {other.seed}")["val"])
    return out[COMPARED[0]], out[COMPARED[1]]


def smooth(xs: list[float], k: int = 10) -> list[float]:
    return [statistics.mean(xs[max(0, i - k + 1):i + 1]) for i in range(len(xs))]


def loss_figure(res: dict) -> go.Figure:
    """Training loss against training FLOPs (per token, counted × tokens seen): equal compute on the x axis."""
    fig = go.Figure()
    for i, name in enumerate(RUNS):
        r = res[name]
        x = [(s + 1) * r["flops"] for s in range(len(r["loss"]))]
        fig.add_trace(go.Scatter(x=x, y=smooth(r["loss"]), name=f"{name}: {r['params'] / 1e6:.2f} M parameters, "
                                 f"{r['active'] / 1e6:.2f} M active", line=dict(color=plots.color(i))))
    plots.style(fig, "Training loss at equal compute", "training FLOPs per token position × steps", "loss (smoothed)")
    fig.update_xaxes(type="log")
    return fig


def findings(ledger: Ledger, res: dict, S: Settings, seeds: tuple[list[float], list[float]] | None = None) -> Findings:
    d, m = res["dense, same active"], res["MoE"]
    ledger.add("moe_flops", "An MoE step's FLOPs per token follow its active parameters: the counter's count ÷ "
               "(6 × active matrix weights + 12·L·s·h) (capacity drops and the router's extra make it differ)",
               m["flops"] / m["formula"], approx(1.0, rel=0.05), kind="counted")
    ledger.note("params", {k: {"total": res[k]["params"], "active": res[k]["active"]} for k in RUNS})
    gap = d["val"] - m["val"]
    paired = evidence.paired(*seeds) if seeds else None  # dense − MoE, seed by seed (lesson 18)
    if paired is not None:
        ledger.note("dense_minus_moe_over_seeds", dataclasses.asdict(paired))
        lower = sum(x > y for x, y in zip(*seeds))
        answer = (f"{'Yes' if paired.low > 0 else 'Not settled'}: over {in_words(paired.n)} seeds the MoE ended "
                  f"**{paired.estimate:.2f}** nats below the dense model of its active size on average, lower on "
                  f"{in_words(lower)} of them; " + ("paired by seed, the interval clears zero." if paired.low > 0 else
                                                    "paired by seed, the interval still reaches zero: more seeds "
                                                    "would be needed to settle it (lesson 18)."))
    elif S.beats_margin is not None:
        ledger.add("moe_beats_dense_active", f"At the same FLOPs per token the MoE ends at least {S.beats_margin:g} "
                   "nats below the dense model with its active parameters (dense − MoE)", gap,
                   at_least(S.beats_margin), kind="measured")
        answer = (f"Yes: at the same FLOPs per token the MoE ended **{gap:.2f}** nats below the dense model of its "
                  "active size, with many more parameters to learn with.")
    else:  # one 150-step run: a gap of a few hundredths changes sign between seeds (lesson 02)
        ledger.note("moe_minus_dense_active", -gap)
        answer = (f"This run cannot say. The MoE ended **{abs(gap):.2f}** nats {'below' if gap > 0 else 'above'} "
                  f"the dense model of its active size after {S.steps} steps, a gap that one short run on one seed "
                  "cannot tell from noise (lesson 02); settling it takes several seeds.")
    ledger.note("val_loss", {k: res[k]["val"] for k in RUNS})
    ledger.note("flops_per_token", {k: res[k]["flops"] for k in RUNS})
    return Findings([
        answer,
        f"What is not in doubt is the price: the MoE holds **{m['params'] / m['active']:.1f}×** the parameters it "
        "uses per token, for the FLOPs of the dense model its active size.",
    ], [
        "| model | parameters | active per token | FLOPs per token ÷ the first | validation loss |\n|---|---|---|---|---|\n"
        + "\n".join(f"| {name} | {r['params'] / 1e6:.2f} M | {r['active'] / 1e6:.2f} M | "
                     f"{r['flops'] / d['flops']:.2f} | {r['val']:.3f} |" for name, r in res.items() if name in RUNS),
        f"Validation loss after {S.steps} steps, the same batches for every model.",
        *([evidence.table([("dense − MoE, paired by seed", paired)])] if paired else []),
    ])


def busiest_share(run: dict, last: float = 0.25) -> float:
    """The busiest expert's share of assignments, averaged over the layers and the last quarter of the steps
    (1/E when perfectly balanced, 1 when one expert takes everything)."""
    loads = np.array(run["load"][-max(1, int(len(run["load"]) * last)):], dtype=float)  # steps × layers × E
    return float((loads.max(-1) / loads.sum(-1)).mean())


def balance_figure(res: dict, S: Settings) -> go.Figure:
    """Share of layer 1's assignments each expert received, step by step, with and without the balancing loss."""
    fig = plots.subplots(1, 2, BALANCE_RUNS, title="Where layer 1's tokens go during training", height=360)
    for col, run in enumerate((res["MoE"], res["no balance"]), 1):
        loads = np.array(run["load"], dtype=float)[:, 0, :]
        share = (loads / loads.sum(-1, keepdims=True)).T
        fig.add_trace(go.Heatmap(z=share, zmin=0, zmax=1, colorscale="Viridis", showscale=col == 2,
                                 colorbar=dict(title="share"),
                                 hovertemplate="step %{x}, expert %{y}: %{z:.0%}<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title_text="step", row=1, col=col)
        fig.update_yaxes(title_text="expert" if col == 1 else None, dtick=1, row=1, col=col)
    return fig


def balance_findings(ledger: Ledger, res: dict, S: Settings) -> Findings:
    on, off = busiest_share(res["MoE"]), busiest_share(res["no balance"])
    ledger.add("collapse_without_balance", "Without the balancing loss the busiest expert takes a larger share of "
               "the tokens than with it (share without − share with, last quarter of training)", off - on,
               at_least(0.05), kind="measured")
    ledger.add("balanced_with_loss", f"With it, the busiest expert's share stays within 1.5 × the even 1/E = "
               f"{1 / S.n_experts:.2f} (share × E)", on * S.n_experts, at_most(1.5), kind="measured")
    dropped = {k: statistics.mean(res[k]["dropped"][-max(1, len(res[k]["dropped"]) // 4):])
               for k in ("MoE", "no balance")}
    ledger.note("busiest_share", {"with": on, "without": off})
    ledger.note("dropped", dropped)
    return Findings([
        f"Unevenly, without help: without the balancing loss the busiest expert took **{off:.0%}** of the "
        f"assignments, against **{on:.0%}** with it. Crowded experts then drop what does not fit.",
    ], [
        f"An even split gives each expert {1 / S.n_experts:.0%} of the assignments.",
        f"At capacity factor {S.capacity_factor}, over the last quarter of training: {dropped['MoE']:.1%} of "
        "assignments dropped with the loss, "
        f"{dropped['no balance']:.1%} without.",
    ])


def routing_figure(logits: list[torch.Tensor], k: int, factor: float, title: str) -> go.Figure:
    """Re-route saved router logits at another top-k and capacity factor: load per expert and what overflows."""
    E = logits[0].size(-1)
    fig = go.Figure()
    kept_all, total = 0, 0
    for i, lg in enumerate(logits):
        r = route(lg, k, capacity(lg.size(0), E, k, factor))
        load = r.load().tolist()
        kept = [int(r.kept[r.expert == e].sum()) for e in range(E)]
        kept_all, total = kept_all + sum(kept), total + sum(load)
        fig.add_trace(go.Bar(x=[f"expert {e}" for e in range(E)], y=kept, name=f"layer {i + 1}: kept",
                             marker_color=plots.color(i), offsetgroup=i))
        fig.add_trace(go.Bar(x=[f"expert {e}" for e in range(E)], y=[a - b for a, b in zip(load, kept)],
                             base=kept, name=f"layer {i + 1}: dropped", marker_color="#cf222e", opacity=0.6,
                             offsetgroup=i, showlegend=i == 0))
    cap = capacity(logits[0].size(0), E, k, factor)
    plots.marked_line(fig, y=cap, text=f"capacity {cap}")
    plots.style(fig, f"{title}: top-{k}, capacity factor {factor:g} — {1 - kept_all / total:.1%} dropped", None,
                "assignments")
    return fig


def routing_panel(res: dict, S: Settings) -> Panel:
    saved = {"balancing loss on": res["MoE"]["logits"], "balancing loss off": res["no balance"]["logits"]}
    style = {"description_width": "initial"}
    lo, hi = Settings.RANGES["CAPACITY_FACTOR"]
    controls = {
        "run": W.Dropdown(options=list(saved), value="balancing loss on", description="router", style=style),
        "k": W.SelectionSlider(options=list(range(1, S.n_experts + 1)), value=S.top_k, description="top-k",
                               style=style),
        # every factor the lesson's parameter allows, its ends and the run's own among them
        "factor": choice_slider(S.capacity_factor, lo, hi, "capacity factor", include=(lo, hi)),
    }
    return Panel(lambda run, k, factor: routing_figure(saved[run], k, factor, run), controls, debounce_ms=0,
                 title="Route the trained routers again")

