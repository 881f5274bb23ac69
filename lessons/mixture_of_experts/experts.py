"""Lesson 15, section 4: expert parallelism on real ranks — all-to-all there and back, parity with one process,
bytes predicted, counted and on the wire."""

import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, at_most, is_true
from labtools.config import derive
from labtools.parallel import launch
from labtools.parallel.diagnose import Ranks
from lessons.mixture_of_experts import Settings, ranks
from lessons.mixture_of_experts.ranks import ExpertJob, ExpertRun


def job(S: Settings) -> ExpertJob:
    return derive(ExpertJob, S, n_experts=S.n_experts, top_k=S.top_k, capacity_factor=2.0, tokens=S.ep_tokens,
                  dp=S.dp)


def run(S: Settings) -> Ranks[ExpertRun]:
    """One launch of dp × ep ranks (gloo on the CPU, NCCL where every rank has a GPU)."""
    return launch(ranks.expert_parallel, S.dp * S.ep, job(S), desc=f"experts: dp {S.dp} × ep {S.ep}",
                  timeout_s=300)


def predicted_bytes(tokens: int, k: int, n_embd: int, ranks_: int, bytes_per_element: int = 4) -> float:
    """Bytes a rank sends per forward and backward if its router spread tokens evenly: k·tokens assignments, of
    which (N−1)/N go to the other ranks of its expert-parallel group, each a row of n_embd numbers sent there and
    its result sent back; backward sends the gradients the same two ways."""
    return 4 * k * tokens * (ranks_ - 1) / ranks_ * n_embd * bytes_per_element


def predicted(res: list[ExpertRun], S: Settings) -> float:
    """predicted_bytes for this launch's expert-parallel group size."""
    return predicted_bytes(S.ep_tokens, S.top_k, S.n_embd, res[0].ep)


def figure(res: list[ExpertRun], S: Settings) -> go.Figure:
    """Bytes each rank sent: predicted for an even router, counted from the actual routing, read off the wire."""
    N, ep = len(res), res[0].ep
    labels = [f"rank {r}" for r in range(N)]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=[x.bytes / 1e3 for x in res],
                         name="counted (this routing)", marker_color=plots.color(0)))
    if all(x.wire is not None for x in res):
        fig.add_trace(go.Bar(x=labels, y=[res[0].wire / N / 1e3] * N,
                             name="on the wire ÷ ranks (loopback)", marker_color=plots.color(1)))
    plots.marked_line(fig, y=predicted(res, S) / 1e3, text="predicted, even router")
    plots.style(fig, f"Expert parallelism, {N // ep} groups of {ep} ranks: bytes per forward and backward", None,
                "kB")
    fig.update_layout(barmode="group")
    return fig


def findings(ledger: Ledger, res: Ranks[ExpertRun], S: Settings) -> Findings:
    N, ep, dp = len(res), res[0].ep, res[0].dp
    even = predicted(res, S)
    worst = max(x.max_diff.largest() for x in res)
    ledger.add("ep_parity", f"Experts spread over groups of {ep} ranks, tokens sent by all-to-all, {dp} groups "
               "data-parallel: output and the gradients of the tokens, the router and every expert equal one "
               "process's (largest difference)", worst, at_most(1e-5), kind="measured")
    ledger.add("ep_local_only", "Each rank's backward touches only its own experts' weights",
               all(x.others_untouched for x in res), is_true(), kind="measured", detail=True)
    counted = sum(x.bytes for x in res)
    mean = counted / N / even
    ledger.add("ep_predicted", "A rank sends about what an even router predicts, 4·k·tokens·(ep−1)/ep rows of h "
               "numbers (counted ÷ predicted, mean over ranks; a fresh router is nearly even)", mean,
               approx(1.0, rel=0.25), kind="counted")
    details = [f"The layout: dp = {dp} groups of ep = {ep} ranks ({res.dist[0].backend}); output and gradients within "
               f"{worst:.1e} of one process's."]
    if res[0].wire is not None:
        ledger.add("ep_wire", "The bytes on the wire match what the ranks handed to all-to-all (wire ÷ counted; "
                   "headers and the exchanged counts add a little)", res[0].wire / counted, approx(1.0, rel=0.15),
                   kind="measured")
        details.append(f"The ranks handed all-to-all {counted / 1e3:,.0f} kB; {res[0].wire / 1e3:,.0f} kB "
                       "crossed the loopback interface.")
    ledger.note("ep_bytes", {"counted": [x.bytes for x in res], "predicted": even,
                             "wire": res[0].wire, "load": [x.load for x in res]})
    spread = max(x.bytes for x in res) / min(x.bytes for x in res)
    details.append(f"An even router predicts {even / 1e3:,.0f} kB per rank; the ranks sent between "
                   f"{min(x.bytes for x in res) / 1e3:,.0f} and {max(x.bytes for x in res) / 1e3:,.0f} kB.")
    return Findings([
        "Each rank holds some of the experts, and two all-to-alls carry every token to its expert's rank and back: "
        "output and gradients equal one process's to float rounding.",
        f"Each rank's traffic follows its routing, not an even share: the busiest sent **{spread:.2f}×** the "
        "quietest.",
    ], details)
