"""Lesson 07, the collectives primer: who holds what before and after each collective, and the ring all-reduce
step by step. The pictures come from labtools' own ring schedule (ring_steps) and each "after" is checked against
the same collective run on real ranks."""

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, is_true
from labtools.controls import slider
from labtools.parallel import launch
from labtools.parallel.comm import ring_steps
from labtools.widgets import Panel
from lessons.data_parallel import Settings, ring_ranks
from lessons.data_parallel.ring_ranks import Collective, CollectivesResult

# A cell holds a set of ranks: the ranks whose data it sums. None: the rank holds no data there.
KINDS = {
    Collective.BROADCAST: "rank 0's tensor is copied to every rank",
    Collective.REDUCE: "the sum arrives on rank 0 only",
    Collective.ALL_REDUCE: "every rank ends with the sum",
    Collective.REDUCE_SCATTER: "the sum, cut in N chunks: rank r keeps chunk r",
    Collective.ALL_GATHER: "each rank's chunk r, gathered on every rank",
    Collective.ALL_TO_ALL: "rank r's chunk i goes to rank i",
}
RING = Collective.RING_ALL_REDUCE


def before(kind: Collective, n: int) -> list[list]:
    """Rank r's chunks before the collective."""
    if kind == Collective.BROADCAST:
        return [[{0} if r == 0 else None for _ in range(n)] for r in range(n)]
    if kind == Collective.ALL_GATHER:
        return [[{r} if c == r else None for c in range(n)] for r in range(n)]
    return [[{r} for _ in range(n)] for r in range(n)]


def after(kind: Collective, n: int) -> list[list]:
    """Rank r's chunks after the collective (the ring: after its last step)."""
    everyone = set(range(n))
    if kind == Collective.BROADCAST:
        return [[{0} for _ in range(n)] for _ in range(n)]
    if kind == Collective.REDUCE:
        return [[set(everyone) for _ in range(n)] if r == 0 else [{r} for _ in range(n)] for r in range(n)]
    if kind in (Collective.ALL_REDUCE, RING):
        return [[set(everyone) for _ in range(n)] for _ in range(n)]
    if kind == Collective.REDUCE_SCATTER:
        return [[set(everyone) if c == r else None for c in range(n)] for r in range(n)]
    if kind in (Collective.ALL_GATHER, Collective.ALL_TO_ALL):
        return [[{c} for c in range(n)] for _ in range(n)]
    raise ValueError(f"collective must be one of {[str(k) for k in (*KINDS, RING)]}, got {kind!r}")


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
        "kind": W.Dropdown(options=[("ring all-reduce, step by step", RING)] + [(str(k), k) for k in KINDS], value=RING,
                           description="collective"),
        "n": slider(max(S.world_sizes), 2, 6, 1, description="ranks N"),
        "step": slider(0, 0, 10, 1, description="step"),
    }
    return Panel(draw, controls, title="Who holds what: each cell is a chunk, its label the ranks it sums")


def run(S: Settings) -> list[CollectivesResult]:
    """Every collective once on max(S.world_sizes) gloo ranks: what each rank held afterwards."""
    return launch(ring_ranks.collectives, max(S.world_sizes), None, backend="gloo", desc="collectives")


def _as_sets(masks: list) -> list:
    return [None if m is None else {r for r in range(m.bit_length()) if m >> r & 1} for m in masks]


def findings(ledger: Ledger, res: list[CollectivesResult]) -> Findings:
    n = len(res)
    agree = {}
    for kind in [*KINDS, RING]:
        real = [_as_sets(r.held[kind]) for r in res]
        pictured = ring_states(n)[-1] if kind == RING else after(kind, n)  # the ring: its stepped picture's end
        agree[kind] = real == pictured
        ledger.add(f"picture_{kind}", f"{kind}: the picture's 'after' is what {n} real gloo ranks held (every rank, "
                   "every chunk)", agree[kind], is_true(), kind="measured", detail=True)
    ledger.add("pictures_real", f"Every collective's picture matches {n} real ranks ({len(agree)} collectives, "
               "the written-out ring's last step included)", all(agree.values()), is_true(), kind="measured")
    same = sum(agree.values())
    verdict = (f"Each collective moves chunks as its picture shows: what **{n}** real ranks held afterwards is "
               "what the picture ends with."
               if same == len(agree) else f"Not always as pictured: only {same} of {len(agree)} pictures match what "
               f"{n} real ranks held afterwards.")
    return Findings([verdict, f"The ring, stepped send by send, ends after **{2 * (n - 1)}** steps where "
                              "PyTorch's all-reduce does: every rank holds the sum of every chunk."],
                    [f"Collectives checked: {len(agree)}, each on every rank and every chunk.",
                     "Each rank r starts with the value 2^r in every chunk, so a value held afterwards names exactly "
                     "the ranks it sums."])
