"""Lesson 09 — pipeline parallelism: real stages on real ranks, measured timelines, the bubble against its formula.

The notebook side of notebooks/09_pipeline_parallel.ipynb: settings, launches, figures, findings, panels and
exercises. The functions that run inside the ranks are in lessons/ranks/pipeline.py; the schedules as data in
labtools/pipeline.py; the formula in labtools/plan.py.
"""

from dataclasses import dataclass

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Ledger, approx, at_most, is_true
from labtools.dist import launch
from labtools.dist.pipeline import check_pipeline
from labtools.pipeline import decompose, idle_fraction, idle_per_row, in_flight, schedule_order, simulate
from labtools.plan import bubble_fraction, collective_bytes, pipeline_efficiency
from labtools.profiles import check_range, resolve
from labtools.widgets import Exercise, Panel, RunCache, answer_check
from lessons.ranks import pipeline as ranks
from lessons.ranks.pipeline import PARITY_SCHEDULES, PipeJob, runs_at

CURVE_WINDOW = 40  # steps over which training curves are held equal (AdamW amplifies last-bit differences)
ARTICLE_EFFICIENCY = 0.789  # "4 stages, 16 micro-batches: η = (16−1)/(16+4−1) = 78.9%" (a source article)


@dataclass(frozen=True)
class Settings:
    profile: str
    n_layer: int
    n_embd: int
    block_size: int
    batch_size: int             # rows of the whole batch, split into m micro-batches
    m: int                      # micro-batches of the parity check, memory, traffic and training
    micro_batches: tuple        # the timing sweep
    worlds: tuple               # pipeline depths p (one rank per stage)
    t_f_ms: float               # simulated forward per micro-batch per rank (backward: twice as long)
    train_steps: int            # AdamW steps of 1F1B training against one process
    real_compute: bool          # also time the real computation (no padding)
    v: int = 2                  # stages per rank of the interleaved schedules
    lr: float = 3e-3
    seed: int = 0

    def __post_init__(self):
        check_range("M", self.m, max(self.worlds), self.batch_size, int)  # torch's Schedule1F1B needs m >= p
        check_range("T_F_MS", self.t_f_ms, 5.0, 1000.0)
        check_range("TRAIN_STEPS", self.train_steps, 1, 10_000, int)
        check_range("SEED", self.seed, 0, 2**31 - 1, int)
        for p in self.worlds:
            check_pipeline(self.n_layer, p, self.m, self.v)
        for m in (self.m, *self.micro_batches):
            if self.batch_size % m:
                raise ValueError(f"M (and the swept m) must divide the batch of {self.batch_size} rows, got {m}")


PROFILES = {
    "smoke": Settings("smoke", n_layer=8, n_embd=64, block_size=32, batch_size=16, m=4, micro_batches=(1, 2, 4, 8, 16),
                      worlds=(2, 4), t_f_ms=20.0, train_steps=8, real_compute=False),
    "cpu": Settings("cpu", n_layer=8, n_embd=64, block_size=32, batch_size=16, m=8, micro_batches=(1, 2, 4, 8, 16),
                    worlds=(2, 4), t_f_ms=20.0, train_steps=40, real_compute=True),
    "gpu": Settings("gpu", n_layer=8, n_embd=384, block_size=256, batch_size=32, m=8,
                    micro_batches=(1, 2, 4, 8, 16, 32),
                    worlds=(2, 4), t_f_ms=20.0, train_steps=100, real_compute=True),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


def job(S: Settings, **changes) -> PipeJob:
    fields = dict(n_layer=S.n_layer, n_embd=S.n_embd, block_size=S.block_size, batch_size=S.batch_size, m=S.m,
                  v=S.v, micro_batches=tuple(S.micro_batches), t_f_ms=S.t_f_ms, t_b_ms=2 * S.t_f_ms,
                  train_steps=S.train_steps, lr=S.lr, seed=S.seed)
    return PipeJob(**(fields | changes))


def run(S: Settings, p: int) -> dict:
    """One launch of p ranks: parity, simulated-compute timelines, memory, traffic and training; then the real-
    compute timelines (a second launch) where the profile asks, and the one-process training reference."""
    res = launch(ranks.lesson_run, p, job(S), desc=f"pipeline × {p}", timeout_s=None)
    out = {"ranks": res, "single_losses": ranks.single_process_losses(job(S)), "real": None}
    if S.real_compute:
        real = launch(ranks.timelines, p, job(S, simulate=False, schedules=("gpipe", "1f1b")),
                      desc=f"real compute × {p}", timeout_s=None)
        out["real"] = real[0]["timelines"]
    return out


# --- 1. the schedule, drawn ---------------------------------------------------------------------------------------

def grid_figure(schedule: str, p: int, m: int, v: int = 1) -> go.Figure:
    """The schedule on an idealised machine (forward 1 unit, backward 2, per rank), and its formula."""
    vv = v if schedule == "interleaved" else 1
    intervals = simulate(schedule_order(schedule, p, m, vv), 1.0, 2.0, vv)
    idle = idle_fraction(intervals, p)
    fig = plots.timeline(intervals, unit="time units (forward = 1)",
                         title=f"{schedule}, p = {p}, m = {m}{f', v = {vv}' if vv > 1 else ''}: idle {idle:.1%} — "
                               f"formula (p−1)/({'v·' if vv > 1 else ''}m+p−1) = {bubble_fraction(p, m, vv):.1%}")
    return fig


def schedule_panel(S: Settings) -> Panel:
    """Schedule, p, m, v → the static grid and the formula, redrawn at once (no processes)."""
    def draw(schedule, p, m, v):
        if schedule == "interleaved" and m % p:
            m = p * max(1, round(m / p))  # interleaving needs m a multiple of p: the nearest one
        return grid_figure(schedule, p, m, v)

    style = {"description_width": "initial"}
    controls = {
        "schedule": W.Dropdown(options=["gpipe", "1f1b", "interleaved"], value="1f1b", description="schedule"),
        "p": W.IntSlider(value=max(S.worlds), min=2, max=8, description="stages p", style=style),
        "m": W.IntSlider(value=S.m, min=1, max=max(32, S.m), description="micro-batches m", style=style),
        "v": W.IntSlider(value=S.v, min=2, max=max(4, S.v), description="chunks per rank v (interleaved)", style=style),
    }
    return Panel(draw, controls, debounce_ms=0, title="A pipeline schedule, drawn from its order (forward 1, "
                                                      "backward 2)")


# --- 2. parity ------------------------------------------------------------------------------------------------------

def parity_table(results: dict[int, dict]) -> go.Figure:
    rows = []
    for p, r in results.items():
        for s in PARITY_SCHEDULES:
            entries = [rank["parity"][s] for rank in r["ranks"]]
            ran = all(e["ran"] for e in entries)
            worst = max(e["max_grad_diff"] for e in entries) if ran else None
            rows.append((f"p = {p}", s, "ran" if ran else "failed: " + next(e["error"] for e in entries
                                                                         if not e["ran"])[:60],
                         f"{worst:.1e}" if ran else "—"))
    return plots.table(("", "schedule", "on this backend", "max |Δ gradient| vs one process"), rows,
                       title="Every schedule's gradients against one process on the same batch")


def parity_findings(ledger: Ledger, results: dict[int, dict]) -> str:
    parts = []
    for p, r in results.items():
        backend = r["ranks"][0]["dist"]["backend"]
        per = {s: [rank["parity"][s] for rank in r["ranks"]] for s in PARITY_SCHEDULES}
        ran = [s for s, e in per.items() if all(x["ran"] for x in e)]
        worst = max(x["max_grad_diff"] for s in ran for x in per[s])
        ledger.add(f"parity_{p}", f"p = {p}: every schedule that ran gives one process's gradients (max |Δ| over "
                   f"ranks and schedules, fp32, measured)", worst, at_most(1e-6), kind="measured")
        for s in ("written-out gpipe", "written-out 1f1b", "gpipe", "1f1b", "interleaved"):
            ledger.add(f"ran_{s}_{p}", f"p = {p}: {s} runs on {backend}", s in ran, is_true(), kind="measured")
        missed = [s for s in PARITY_SCHEDULES if s not in ran]
        diffs = [abs(a - b) for a, b in zip(r["ranks"][0]["losses"], r["single_losses"])]
        curve = max(diffs[:CURVE_WINDOW])
        ledger.add(f"curve_{p}", f"p = {p}: the first {min(len(diffs), CURVE_WINDOW)} AdamW steps of 1F1B training "
                   "match one process (max |Δ loss|, measured; rounding differs, so longer runs drift slowly)", curve,
                   at_most(1e-3), kind="measured")
        ledger.note(f"curve_{p}_whole_run", max(diffs))
        parts.append(f"**p = {p}** ({backend}): {len(ran)} of {len(PARITY_SCHEDULES)} schedules ran "
                     f"({', '.join(ran)}){'; failed: ' + ', '.join(missed) if missed else ''}. Worst gradient "
                     f"difference from one process: {worst:.1e}; training loss curves differ by at most {curve:.1e}.")
    return " ".join(parts)


def training_figure(results: dict[int, dict]) -> go.Figure:
    fig = go.Figure()
    p0 = min(results)
    fig.add_trace(go.Scatter(y=results[p0]["single_losses"], name="one process", line=dict(width=5), opacity=0.35))
    for i, (p, r) in enumerate(results.items()):
        fig.add_trace(go.Scatter(y=r["ranks"][0]["losses"], name=f"1F1B, {p} stages", mode="lines+markers",
                                 line=dict(dash="dot", color=plots.color(i + 1))))
    return plots.style(fig, "Training loss: a pipeline vs one process on the same batches", "step", "loss")


# --- 3. timelines and the bubble ------------------------------------------------------------------------------------

def measured(results: dict[int, dict], real: bool = False) -> dict[tuple, list[dict]]:
    """{(p, schedule, m): intervals} of the simulated (or real) compute runs."""
    out = {}
    for p, r in results.items():
        tl = r["real"] if real else r["ranks"][0]["timelines"]
        for key, intervals in (tl or {}).items():
            schedule, m = key.split("|")
            out[(p, schedule, int(m))] = intervals
    return out


def formula(p: int, schedule: str, m: int, v: int) -> float:
    return bubble_fraction(p, m, v if schedule == "interleaved" else 1)


def timeline_figure(intervals: list[dict], p: int, schedule: str, m: int, v: int, real: bool = False) -> go.Figure:
    d = decompose(intervals)
    per_rank = ", ".join(f"rank {r} {x:.0%}" for r, x in idle_per_row(intervals).items())
    fig = plots.timeline(intervals, unit="ms", title=f"{schedule}, p = {p}, m = {m} — measured "
                         f"({'real' if real else 'simulated'} compute): bubble {d['bubble']:.1%} + latency "
                         f"{d['latency']:.1%}; formula {formula(p, schedule, m, v):.1%}")
    fig.add_annotation(text=f"idle per rank: {per_rank}", xref="paper", yref="paper", x=0, y=-0.32,
                       showarrow=False, xanchor="left")
    return fig


def bubble_figure(runs: dict[tuple, list[dict]], v: int, title: str) -> go.Figure:
    """Measured bubble (filled markers) and all idle time, latency included (open markers), against the formula."""
    fig = go.Figure()
    ms = sorted({m for (_, _, m) in runs})
    dense = [x / 4 for x in range(4, 4 * max(ms) + 1)]
    for i, p in enumerate(sorted({p for (p, _, _) in runs})):
        c = plots.color(i)
        fig.add_trace(go.Scatter(x=dense, y=[(p - 1) / (x + p - 1) for x in dense], mode="lines", line=dict(color=c),
                                 name=f"(p−1)/(m+p−1), p = {p}"))
        fig.add_trace(go.Scatter(x=dense, y=[(p - 1) / (v * x + p - 1) for x in dense], mode="lines",
                                 line=dict(color=c, dash="dot"), name=f"(p−1)/(v·m+p−1), p = {p}, v = {v}"))
        for schedule, symbol in (("gpipe", "circle"), ("1f1b", "diamond"), ("interleaved", "x")):
            pts = sorted((m, decompose(iv)) for (pp, s, m), iv in runs.items() if pp == p and s == schedule)
            if pts:
                fig.add_trace(go.Scatter(x=[a for a, _ in pts], y=[d["bubble"] for _, d in pts], mode="markers",
                                         marker=dict(color=c, symbol=symbol, size=10),
                                         name=f"bubble, {schedule}, p = {p}"))
                fig.add_trace(go.Scatter(x=[a for a, _ in pts], y=[1 - d["busy"] for _, d in pts], mode="markers",
                                         marker=dict(color=c, symbol=f"{symbol}-open", size=10),
                                         name=f"all idle, {schedule}, p = {p}"))
    plots.style(fig, title, "micro-batches m", "fraction of ranks × step time", height=460, legend="right")
    fig.update_xaxes(type="log")
    return fig


def bubble_findings(ledger: Ledger, S: Settings, results: dict[int, dict]) -> str:
    runs = measured(results)
    parts = {key: decompose(iv) for key, iv in runs.items()}
    gaps = {key: d["bubble"] - formula(key[0], key[1], key[2], S.v) for key, d in parts.items()}
    for p in results:
        for schedule in ("gpipe", "1f1b", "interleaved"):
            keys = [k for k in gaps if k[0] == p and k[1] == schedule]
            if keys:
                worst = max(keys, key=lambda k: abs(gaps[k]))
                f = "(p−1)/(v·m+p−1)" if schedule == "interleaved" else "(p−1)/(m+p−1)"
                ledger.add(f"bubble_{schedule}_{p}", f"p = {p}, {schedule}, simulated compute: the measured bubble is "
                           f"within 0.05 of {f} for every m swept (worst |measured − formula|, at m = {worst[2]})",
                           abs(gaps[worst]), at_most(0.05), kind="measured")
    key = (4, "1f1b", 16) if (4, "1f1b", 16) in runs else max(runs, key=lambda k: (k[0], k[2]))
    eff = 1 - parts[key]["bubble"]
    f_eff = pipeline_efficiency(key[0], key[2])
    ledger.add("article_78_9", f"The source article's \"{key[0]} stages, {key[2]} micro-batches: η = 78.9%\" is wrong: "
               f"measured efficiency ({key[1]}, 1 − bubble) − 78.9%; the formula's m/(m+p−1) = {f_eff:.1%} says "
               f"+{f_eff - ARTICLE_EFFICIENCY:.3f}", eff - ARTICLE_EFFICIENCY,
               approx(f_eff - ARTICLE_EFFICIENCY, abs=0.03), source="a source article: η = (16−1)/(16+4−1)",
               kind="measured")
    ledger.note("bubble_gaps", {f"p{k[0]} {k[1]} m{k[2]}": g for k, g in gaps.items()})
    ledger.note("latency", {f"p{k[0]} {k[1]} m{k[2]}": d["latency"] for k, d in parts.items()})
    overruns = sum(r["overruns"] for res in results.values() for r in res["ranks"])
    worst = max(gaps.values(), key=abs)
    lat = [d["latency"] for d in parts.values()]
    return (f"With each forward padded to {S.t_f_ms:g} ms and each backward to {2 * S.t_f_ms:g} ms per rank, the "
            f"measured bubble — time a rank waited for an input still being computed on another rank, read from "
            f"the timestamps — follows the formula: the worst gap over {len(gaps)} runs is {worst:+.3f}. On top of "
            f"it, {min(lat):.1%}–{max(lat):.1%} of the time went to *latency*: the input existed but had not "
            "arrived yet (the message, the schedule's own bookkeeping, a rank waking up on a shared core). At p = "
            f"{key[0]}, m = {key[2]} the ranks were busy or merely waiting for messages "
            f"**{eff:.1%}** of the time — the formula's {key[2]}/({key[2]}+{key[0]}−1) = {f_eff:.1%}, not the "
            f"78.9% a source article computes as (m−1)/(m+p−1). {overruns} actions overran their simulated time.")


def real_findings(ledger: Ledger, S: Settings, results: dict[int, dict]) -> str:
    runs = measured(results, real=True)
    if not runs:
        return ("This profile runs simulated compute only; the `cpu` and `gpu` profiles also time the real "
                "computation.")
    ledger.note("real_idle", {f"p{p} {s} m{m}": decompose(iv) for (p, s, m), iv in runs.items()})
    by_p = {p: [1 - decompose(iv)["busy"] for (pp, s, m), iv in runs.items() if pp == p] for p in results}
    return ("With real compute, " + "; ".join(
        f"p = {p}: idle {min(v):.0%}–{max(v):.0%} over the sweep" for p, v in by_p.items() if v)
        + ". On a shared CPU the ranks are not independent devices: p ranks on fewer cores take turns, so a "
        "rank's 'idle' time includes waiting for a core, and each action carries about a millisecond of "
        "schedule and message overhead — at these tiny stage sizes that is as long as the compute itself. The "
        "formula assumes p devices that each run one stage at full speed; the simulated mode gives it exactly "
        "that, real GPUs come close.")


# --- 4. memory and communication ----------------------------------------------------------------------------------

def memory_figure(results: dict[int, dict], m: int) -> go.Figure:
    fig = plots.subplots(1, len(results), [f"p = {p}, m = {m}" for p in results], height=380)
    for col, (p, r) in enumerate(results.items(), 1):
        predicted = {"gpipe": [m] * p, "1f1b": in_flight(schedule_order("1f1b", p, m))}
        for i, schedule in enumerate(("gpipe", "1f1b")):
            held = [rk["memory"][schedule] / rk["memory"]["per_micro_batch"] for rk in r["ranks"]]
            x = [f"rank {k}" for k in range(p)]
            fig.add_trace(go.Bar(x=x, y=held, name=f"{schedule}, measured", marker_color=plots.color(i),
                                 showlegend=col == 1), row=1, col=col)
            fig.add_trace(go.Scatter(x=x, y=predicted[schedule], mode="markers", name=f"{schedule}, predicted",
                                     marker=dict(color="black", symbol="line-ew-open", size=30, line=dict(width=3)),
                                     showlegend=col == 1 and i == 0), row=1, col=col)
    fig.update_yaxes(title_text="peak saved activations ÷ one micro-batch's", row=1, col=1)
    fig.update_layout(barmode="group")
    return fig


def memory_findings(ledger: Ledger, results: dict[int, dict], m: int) -> str:
    parts = []
    for p, r in results.items():
        held = {s: [rk["memory"][s] / rk["memory"]["per_micro_batch"] for rk in r["ranks"]] for s in ("gpipe", "1f1b")}
        pred = in_flight(schedule_order("1f1b", p, m))
        ledger.add(f"mem_gpipe_{p}", f"p = {p}: GPipe holds all m = {m} micro-batches' activations on every rank "
                   "(worst |measured peak ÷ one micro-batch − m|)", max(abs(h - m) for h in held["gpipe"]),
                   at_most(0.05), kind="measured")
        ledger.add(f"mem_1f1b_{p}", f"p = {p}: 1F1B holds min(p − r, m) on rank r (worst |measured − predicted|)",
                   max(abs(h - q) for h, q in zip(held["1f1b"], pred)), at_most(0.05), kind="measured")
        parts.append(f"p = {p}: GPipe held {', '.join(f'{h:.2f}' for h in held['gpipe'])} micro-batches' worth per "
                     f"rank; 1F1B {', '.join(f'{h:.2f}' for h in held['1f1b'])} (predicted {pred}).")
    return (" ".join(parts) + " Measured: the bytes autograd keeps for backward on each rank, at their peak during "
            "one step, divided by what one micro-batch through that rank's stage keeps. Same bubble, same "
            "gradients — 1F1B's order just starts each backward as early as it can.")


def traffic_table(results: dict[int, dict], S: Settings) -> go.Figure:
    rows = []
    for p, r in results.items():
        t = r["ranks"][0]["traffic"]
        pipe_pred = 2 * (p - 1) * S.m * t["activation_bytes"]
        ddp_pred = p * collective_bytes("all_reduce", t["param_bytes"], p)
        rows.append((f"p = {p}", f"{t['activation_bytes']:,}", f"{pipe_pred:,}", _fmt(t["pipeline_wire"]),
                     f"{ddp_pred:,.0f}", _fmt(t["ddp_wire"])))
    return plots.table(("", "b·s·h·4 bytes", "pipeline, predicted", "pipeline, on the wire", "DDP, predicted (ring)",
                        "DDP, on the wire"), rows, title=f"Bytes per training step, all ranks together (m = {S.m})",
                       row_height=32)


def _fmt(x) -> str:
    return "not measurable here" if x is None else f"{x:,}"


def traffic_findings(ledger: Ledger, results: dict[int, dict], S: Settings) -> str:
    parts = []
    for p, r in results.items():
        t = [rk["traffic"] for rk in r["ranks"]]
        act = t[0]["activation_bytes"]
        pipe_pred = 2 * (p - 1) * S.m * act
        counted = sum(x["pipeline_sent_counted"] for x in t)
        ledger.add(f"p2p_counted_{p}", f"p = {p}: the schedule sends one b·s·h activation forward and one gradient "
                   "backward per micro-batch per boundary (bytes torch's stages handed to gloo ÷ 2(p−1)·m·b·s·h·4)",
                   counted / pipe_pred, approx(1.0, abs=1e-9), kind="counted")
        wire, ddp_wire = t[0]["pipeline_wire"], t[0]["ddp_wire"]
        ddp_pred = p * collective_bytes("all_reduce", t[0]["param_bytes"], p)
        if wire is not None:
            ledger.add(f"p2p_wire_{p}", f"p = {p}: … and that is what crossed the loopback interface (wire ÷ "
                       "predicted; headers and local traffic add a little)", wire / pipe_pred, approx(1.0, rel=0.1),
                       kind="measured")
            ledger.add(f"ddp_wire_{p}", f"p = {p}: DDP on the same ranks sends 2(N−1)/N × the gradient bytes from each "
                       "rank (wire ÷ ring prediction)", ddp_wire / ddp_pred, approx(1.0, rel=0.1), kind="measured")
            parts.append(f"p = {p}: {wire:,} bytes on the wire per pipeline step ({wire / pipe_pred:.3f}× the "
                         f"prediction) against {ddp_wire:,} for a DDP step of the same model "
                         f"({ddp_wire / wire:.1f}× more).")
    act = results[min(results)]["ranks"][0]["traffic"]["activation_bytes"]
    return (" ".join(parts) + f" A pipeline moves activations (b·s·h = {act:,} "
            "bytes per micro-batch here) only between neighbours; data parallelism moves every gradient. Which is "
            "cheaper depends on the model: parameters grow as h², activations as b·s·h.")


# --- 5. the panels with measured runs, and exercises ----------------------------------------------------------------

def measured_panel(S: Settings, results: dict[int, dict]) -> tuple[Panel, RunCache]:
    """p, schedule, m → the measured (simulated-compute) timeline: from this notebook's runs, or a short launch."""
    runs = measured(results)

    def launch_one(p, schedule, m):
        res = launch(ranks.timelines, p, job(S, schedules=(schedule,), micro_batches=(m,)),
                     desc=f"{schedule} × {p}, m = {m}", timeout_s=None)
        return res[0]["timelines"][f"{schedule}|{m}"]

    cache = RunCache(launch_one)
    for (p, s, m), iv in runs.items():
        cache.store[cache.key(dict(p=p, schedule=s, m=m))] = iv

    def draw(p, schedule, m):
        if not runs_at(schedule, p, m):
            raise ValueError(f"{schedule} does not run at p = {p}, m = {m} (1F1B needs m ≥ p, interleaving m a "
                             "multiple of p)")
        return timeline_figure(cache(p=p, schedule=schedule, m=m), p, schedule, m, S.v)

    controls = {
        "p": W.SelectionSlider(options=list(S.worlds), value=max(S.worlds), description="stages p"),
        "schedule": W.Dropdown(options=["gpipe", "1f1b", "interleaved"], value="1f1b", description="schedule"),
        "m": W.SelectionSlider(options=sorted(set(S.micro_batches) | {S.m}), value=max(S.worlds) * 2
                               if max(S.worlds) * 2 in S.micro_batches else S.m, description="m"),
    }
    return Panel(draw, controls, title="A measured timeline (new settings launch a short run)"), cache


def exercises(ledger: Ledger) -> list[Exercise]:
    m_needed = next(m for m in range(1, 10_000) if bubble_fraction(8, m) <= 0.05)
    llama = bubble_fraction(16, 16)
    v_needed = next(v for v in range(1, 64) if bubble_fraction(16, 16, v) <= 0.2)
    ledger.add("llama_1f1b", "Llama 3 405B's pp = 16 with 16 micro-batches would idle 15/31 ≈ 48% without "
               "interleaving (computed)", llama, approx(15 / 31, rel=1e-12), source="Llama 3 paper, §3.3.2",
               kind="computed")

    return [
        Exercise("The article's 78.9%", "4 stages, 16 micro-batches, GPipe or 1F1B: what fraction of the time is idle, "
                 "and what fraction is useful work (in %)?", {"bubble": "bubble %", "eff": "efficiency %"},
                 answer_check({"bubble": 100 * bubble_fraction(4, 16), "eff": 100 * pipeline_efficiency(4, 16)}),
                 f"Bubble = (p−1)/(m+p−1) = 3/19 = **{bubble_fraction(4, 16):.1%}**; efficiency m/(m+p−1) = 16/19 = "
                 f"**{pipeline_efficiency(4, 16):.1%}**. The article's (m−1)/(m+p−1) = 15/19 = 78.9% subtracts one "
                 "micro-batch that is not idle."),
        Exercise("Enough micro-batches", "With p = 8 stages, how many micro-batches m make the bubble at most 5%?",
                 {"m": "smallest m"}, answer_check({"m": m_needed}),
                 f"(p−1)/(m+p−1) ≤ 0.05 ⇔ m ≥ 19(p−1) = 133: **m = {m_needed}**. Deep pipelines need large global "
                 "batches — or interleaving."),
        Exercise("Interleaving Llama 3", "pp = 16 with 16 micro-batches idles 15/31. How many stages per rank (v) "
                 "bring the bubble (p−1)/(v·m+p−1) to at most 20%?", {"v": "smallest v"}, answer_check({"v": v_needed}),
                 f"15/(16v + 15) ≤ 0.2 ⇔ v ≥ 3.75: **v = {v_needed}**, bubble {bubble_fraction(16, 16, v_needed):.1%}. "
                 "Each rank then sends v times as many activations: interleaving trades communication for idle "
                 "time."),
    ]


def redraw_findings(ledger: Ledger, redraw_ms: float) -> str:
    ledger.note("schedule_panel_redraw_ms", redraw_ms)
    return f"Redraw time of the schedule panel, measured here (kernel side, median): {redraw_ms:.0f} ms."

