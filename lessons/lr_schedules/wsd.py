"""Lesson 02, section 4: WSD extends a run to a longer horizon without retraining from the start."""

import tempfile

import plotly.graph_objects as go

from labtools import checkpoint, plots
from labtools.claims import Findings, Ledger, at_most, is_true
from labtools.schedules import bind, wsd
from lessons.lr_schedules import Settings, build, train_run
from lessons.lr_schedules.equal_budget import cosine_run


def run(S: Settings) -> dict:
    """One WSD trunk (warmup + stable), branched at the short horizon's decay start; the trunk goes on to the
    long horizon's decay. Cosine runs from scratch for each horizon are the baseline. Decay = 20% of a horizon."""
    long_h = S.horizon
    short_h = long_h // 2
    warmup = long_h // 10
    d_short, d_long = short_h // 5, long_h // 5
    sched = {h: bind(wsd, warmup=warmup, stable=h - d - warmup, decay=d, min_ratio=0.1)
             for h, d in ((short_h, d_short), (long_h, d_long))}
    branch_at = short_h - d_short
    model, opt = build(S, S.peak_lr)
    trunk = train_run(S, sched[long_h], branch_at, S.peak_lr, desc="WSD trunk", model=model, optimizer=opt)
    with tempfile.TemporaryDirectory() as directory:  # a real checkpoint: saved atomically, verified, loaded as data
        checkpoint.save(directory, branch_at, model=model.state_dict(), optimizer=opt.state_dict())
        saved = checkpoint.load(checkpoint.latest(directory))
    branch_model, branch_opt = build(S, S.peak_lr)
    checkpoint.load_model_state(branch_model, saved["model"])
    branch_opt.load_state_dict(saved["optimizer"])
    start = saved["step"]
    short = train_run(S, sched[short_h], short_h - start, S.peak_lr, desc="WSD decay @ short", start_step=start,
                model=branch_model, optimizer=branch_opt)
    long_ = train_run(S, sched[long_h], long_h - branch_at, S.peak_lr, desc="WSD on to long", start_step=branch_at,
                model=model, optimizer=opt)
    cosine = {h: cosine_run(S, h, warmup) for h in (short_h, long_h)}
    return {"short_h": short_h, "long_h": long_h, "trunk": trunk, "short": short, "long": long_, "cosine": cosine,
            "wsd_steps": long_h + d_short, "cosine_steps": short_h + long_h}


def figure(r: dict) -> go.Figure:
    fig = go.Figure()
    def val(h):
        return h.val_step, h.val_loss
    for name, h, color, dash in (("WSD trunk", r["trunk"], plots.color(0), "solid"),
                                 ("WSD → short horizon", r["short"], plots.color(0), "dot"),
                                 ("WSD → long horizon", r["long"], plots.color(0), "dash"),
                                 (f"cosine, {r['short_h']} steps", r["cosine"][r["short_h"]], plots.color(1), "dot"),
                                 (f"cosine, {r['long_h']} steps", r["cosine"][r["long_h"]], plots.color(1), "dash")):
        x, y = val(h)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=name, line=dict(color=color, dash=dash),
                                 marker=dict(size=4)))
    plots.style(fig, "WSD branches from one trunk vs a cosine run per horizon", "step", "val loss")
    return fig


def wsd_stats(r: dict) -> dict:
    return {"wsd_short": r["short"].final_val_loss, "cosine_short": r["cosine"][r["short_h"]].final_val_loss,
            "wsd_long": r["long"].final_val_loss, "cosine_long": r["cosine"][r["long_h"]].final_val_loss,
            "wsd_steps": r["wsd_steps"], "cosine_steps": r["cosine_steps"]}


def findings(ledger: Ledger, S: Settings, r: dict) -> Findings:
    s = wsd_stats(r)
    within = S.agree_within
    ledger.add("wsd_short", f"WSD branched at the short horizon matches a cosine run of that length (|Δ val| ≤ "
               f"{within:g})", abs(s["wsd_short"] - s["cosine_short"]), at_most(within), kind="measured")
    ledger.add("wsd_long", f"… and at the long horizon (|Δ val| ≤ {within:g})", abs(s["wsd_long"] - s["cosine_long"]),
               at_most(within), kind="measured")
    ledger.add("wsd_cheaper", "WSD needs fewer steps for both horizons than two cosine runs (computed from the "
               "schedules' lengths)", s["wsd_steps"] < s["cosine_steps"], is_true(), kind="computed")
    ledger.note("wsd", s)
    gap = max(abs(s["wsd_short"] - s["cosine_short"]), abs(s["wsd_long"] - s["cosine_long"]))
    return Findings([
        f"Yes: a WSD run branched at each horizon ends within **{gap:.2f}** nats of a cosine run of that length, and "
        f"serves both budgets in {s['wsd_steps'] / s['cosine_steps']:.0%} of the steps two cosine runs take.",
    ], [
        f"Short horizon ({r['short_h']} steps): WSD {s['wsd_short']:.3f}, cosine {s['cosine_short']:.3f}.",
        f"Long horizon ({r['long_h']} steps): WSD {s['wsd_long']:.3f}, cosine {s['cosine_long']:.3f}.",
        f"Steps for both: WSD {s['wsd_steps']} (one trunk, plus the short branch's decay), cosine {s['cosine_steps']} "
        "(two runs from scratch).",
    ])
