"""Lesson 07, the collectives primer: who holds what before and after each collective, and the ring all-reduce
step by step. The pictures come from labtools' own ring schedule (ring_steps) and each "after" is checked against
the same collective run on real ranks."""

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, is_true
from labtools.parallel import launch
from labtools.parallel.comm import ring_steps
from labtools.widgets import Panel, slider
from lessons.data_parallel import Settings, ranks

# A cell holds a set of ranks: the ranks whose data it sums. None: the rank holds no data there.
KINDS = {
    "broadcast": "rank 0's tensor is copied to every rank",
    "reduce": "the sum arrives on rank 0 only",
    "all_reduce": "every rank ends with the sum",
    "reduce_scatter": "the sum, cut in N chunks: rank r keeps chunk r",
    "all_gather": "each rank's chunk r, gathered on every rank",
    "all_to_all": "rank r's chunk i goes to rank i",
}
RING = "ring_all_reduce"


def before(kind: str, n: int) -> list[list]:
    """Rank r's chunks before the collective."""
    if kind == "broadcast":
        return [[{0} if r == 0 else None for _ in range(n)] for r in range(n)]
    if kind == "all_gather":
        return [[{r} if c == r else None for c in range(n)] for r in range(n)]
    return [[{r} for _ in range(n)] for r in range(n)]


def after(kind: str, n: int) -> list[list]:
    """Rank r's chunks after the collective (the ring: after its last step)."""
    everyone = set(range(n))
    if kind == "broadcast":
        return [[{0} for _ in range(n)] for _ in range(n)]
    if kind == "reduce":
        return [[set(everyone) for _ in range(n)] if r == 0 else [{r} for _ in range(n)] for r in range(n)]
    if kind in ("all_reduce", RING):
        return [[set(everyone) for _ in range(n)] for _ in range(n)]
    if kind == "reduce_scatter":
        return [[set(everyone) if c == r else None for c in range(n)] for r in range(n)]
    if kind in ("all_gather", "all_to_all"):
        return [[{c} for c in range(n)] for _ in range(n)]
    raise ValueError(f"collective must be one of {[*KINDS, RING]}, got {kind!r}")


def ring_states(n: int) -> list[list[list]]:
    """The ring all-reduce's 2(n − 1) + 1 states: each step, every rank r receives from r − 1 the chunk that rank
    sends (ring_steps) and adds it (reduce-scatter) or copies it (all-gather)."""
    states = [before(RING, n)]
    for i in range(2 * (n - 1)):
        prev, new = states[-1], [list(row) for row in states[-1]]
        for r in range(n):
            phase, _, recv = ring_steps(n, r)[i]
            left_sends = ring_steps(n, (r - 1) % n)[i][1]
            incoming = prev[(r - 1) % n][left_sends]
            new[r][recv] = (prev[r][recv] | incoming) if phase == "reduce" else set(incoming)
        states.append(new)
    return states


def _label(cell, n: int) -> str:
    if cell is None:
        return ""
    return "Σ" if len(cell) == n and n > 2 else "+".join(map(str, sorted(cell)))


def figure(state: list[list], title: str) -> go.Figure:
    n = len(state)
    z = [[None if c is None else len(c) / n for c in row] for row in state]
    fig = go.Figure(go.Heatmap(z=z, x=[f"chunk {c}" for c in range(n)], y=[f"rank {r}" for r in range(n)],
                               text=[[_label(c, n) for c in row] for row in state], texttemplate="%{text}",
                               zmin=0, zmax=1, colorscale="Blues", showscale=False, xgap=3, ygap=3,
                               hovertemplate="%{y}, %{x}: holds the sum of ranks %{text}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    title = plots.wrap_title(title)
    extra = plots.title_room(title)
    fig.update_layout(title=title, height=120 + extra + 48 * n, margin=dict(l=70, r=20, t=60 + extra, b=40))
    return fig


def panel(S: Settings) -> Panel:
    """A collective and a number of ranks → who holds what; for the ring, a slider steps through it."""
    def draw(kind, n, step):
        if kind != RING:
            when = "before" if step == 0 else "after"
            state = before(kind, n) if step == 0 else after(kind, n)
            return figure(state, f"{kind} on {n} ranks, {when} (step 0 = before): {KINDS[kind]}")
        states = ring_states(n)
        s = min(step, len(states) - 1)
        phase = "start" if s == 0 else ("reduce-scatter" if s <= n - 1 else "all-gather")
        return figure(states[s], f"ring all-reduce on {n} ranks: step {s} of {len(states) - 1} ({phase}); "
                                 f"each rank sent {s} of {len(states) - 1} chunks")

    controls = {
        "kind": W.Dropdown(options=[("ring all-reduce, step by step", RING)] + [(k, k) for k in KINDS], value=RING,
                           description="collective"),
        "n": slider(max(S.world_sizes), 2, 6, 1, description="ranks N"),
        "step": slider(0, 0, 10, 1, description="step"),
    }
    return Panel(draw, controls, title="Who holds what: each cell is a chunk, its label the ranks it sums")


def run(S: Settings) -> list[dict]:
    """Every collective once on max(S.world_sizes) gloo ranks: what each rank held afterwards."""
    return launch(ranks.collectives, max(S.world_sizes), None, backend="gloo", desc="collectives")


def _as_sets(masks: list) -> list:
    return [None if m is None else {r for r in range(m.bit_length()) if m >> r & 1} for m in masks]


def findings(ledger: Ledger, res: list[dict]) -> Findings:
    n = len(res)
    agree = {}
    for kind in [*KINDS, RING]:
        real = [_as_sets(r[kind]) for r in res]
        pictured = ring_states(n)[-1] if kind == RING else after(kind, n)  # the ring: its stepped picture's end
        agree[kind] = real == pictured
        ledger.add(f"picture_{kind}", f"{kind}: the picture's 'after' is what {n} real gloo ranks held (every rank, "
                   "every chunk)", agree[kind], is_true(), kind="measured", detail=True)
    ledger.add("pictures_real", f"Every collective's picture matches {n} real ranks ({len(agree)} collectives, "
               "the written-out ring's last step included)", all(agree.values()), is_true(), kind="measured")
    same = sum(agree.values())
    verdict = (f"As pictured: every collective's picture matches what **{n}** real ranks held afterwards."
               if same == len(agree) else f"Not always as pictured: only {same} of {len(agree)} pictures match what "
               f"{n} real ranks held afterwards.")
    return Findings([verdict, f"The ring, stepped send by send, ends after **{2 * (n - 1)}** steps where "
                              "`dist.all_reduce` does: every rank holds the sum of every chunk."],
                    [f"Collectives checked: {len(agree)}, each on every rank and every chunk.",
                     "Each rank r starts with the value 2^r in every chunk, so a value held afterwards names exactly "
                     "the ranks it sums."])
