"""Lesson 11, sections 4–5: sharded checkpoints saved on N ranks and loaded on M, and an elastic restart."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from labtools import plots
from labtools.claims import Findings, Ledger, approx, is_true
from labtools.config import derive
from labtools.parallel import launch
from lessons.fault_tolerance import Settings, ranks
from lessons.fault_tolerance.ranks import ElasticJob, ElasticRun, Loaded, Saved, ShardJob


def shard_job(S: Settings, directory: Path) -> ShardJob:
    return derive(ShardJob, S, batch_size=4, steps=S.dist_steps, directory=str(directory))


def elastic_job(S: Settings, directory: Path, kill: bool) -> ElasticJob:
    return derive(ElasticJob, S, batch_size=4, steps=S.elastic_steps, directory=str(directory),
                  every=max(1, S.elastic_steps // 4), kill_at=S.kill_at if kill else 0)


@dataclass(frozen=True)
class Resharded:
    """The sharded checkpoint's two launches, each rank's result in rank order."""
    saved: list[Saved]      # S.save_world ranks: trained and saved
    loaded: list[Loaded]    # S.load_world ranks: loaded and trained on


@dataclass(frozen=True)
class Elastic:
    """The elastic run twice, each rank's result in rank order."""
    whole: list[ElasticRun]     # uninterrupted
    killed: list[ElasticRun]    # rank 1 SIGKILLed, the group restarted by torchrun


def run(S: Settings, workdir: Path) -> Resharded:
    d = workdir / "dcp"
    d.mkdir()
    saved = launch(ranks.sharded_save, S.save_world, shard_job(S, d), desc=f"FSDP × {S.save_world}: train, save",
                   timeout_s=None)
    loaded = launch(ranks.sharded_load, S.load_world, shard_job(S, d), desc=f"FSDP × {S.load_world}: load",
                    timeout_s=None)
    return Resharded(saved=saved, loaded=loaded)


def run_elastic(S: Settings, workdir: Path) -> Elastic:
    runs = []
    for kill in (False, True):
        d = workdir / f"elastic_{'killed' if kill else 'whole'}"
        d.mkdir()
        runs.append(launch(ranks.elastic, 2, elastic_job(S, d, kill), max_restarts=1 if kill else 0, timeout_s=None,
                           desc="DDP × 2, rank 1 killed" if kill else "DDP × 2, uninterrupted"))
    return Elastic(whole=runs[0], killed=runs[1])


def findings(ledger: Ledger, S: Settings, sh: Resharded) -> Findings:
    s, ld = sh.saved[0], sh.loaded[0]
    same = s.model_digest == ld.model_digest and s.optim_digest == ld.optim_digest
    ledger.add("reshard", f"Saved at {S.save_world} ranks, loaded at {S.load_world}: the whole model and the "
               "optimizer state are bitwise the saved ones (sha256 of the gathered tensors, measured)", same,
               is_true(), kind="measured")
    ledger.add("one_file_per_rank", f"DCP wrote one shard file per saving rank ({S.save_world}) plus .metadata "
               "(counted)", len([f for f in s.files if f.endswith(".distcp")]), approx(S.save_world, abs=0),
               kind="measured", detail=True)
    blocking = float(np.median([r.blocking_s for r in sh.saved]))
    ret = float(np.median([r.async_return_s for r in sh.saved]))
    done = float(np.median([r.async_done_s for r in sh.saved]))
    ledger.note("dcp_seconds", {"blocking": blocking, "async_return": ret, "async_done": done})
    shards = len([f for f in s.files if f.endswith(".distcp")])
    return Findings([
        f"Yes: each of the {S.save_world} ranks wrote only its own shards, and {S.load_world} ranks read back the "
        "slices their layout needs"
        + (": the model and optimizer state were bitwise the saved ones." if same else
           ", but the state they gathered differs from the saved one."),
    ], [
        f"{shards} shard files, one per rank, and one `.metadata` file, which the coordinator wrote last.",
        f"Training went on from the loaded state: next loss {ld.next_loss:.3f}.",
        f"A blocking save took {blocking * 1e3:.0f} ms; the asynchronous one handed control back after "
        f"{ret * 1e3:.0f} ms and finished in the background. At this size fixed costs dominate.",
    ])


def elastic_figure(el: Elastic) -> go.Figure:
    whole, killed = el.whole[0], el.killed[0]
    fig = go.Figure([go.Scatter(x=list(range(1, len(whole.losses) + 1)), y=whole.losses, name="uninterrupted",
                                line=dict(color=plots.color(0))),
                     go.Scatter(x=list(range(1, len(killed.losses) + 1)), y=killed.losses,
                                name=f"rank 1 killed, restarted {killed.restarts}×",
                                line=dict(color=plots.color(1), dash="dot"))])
    fig.add_vline(x=killed.resumed_from, line=dict(color="grey", dash="dash"),
                  annotation_text=f"resumed from step {killed.resumed_from}")
    return plots.style(fig, "Elastic DDP: a rank SIGKILLed, torchrun restarts the group", "step", "training loss")


def elastic_findings(ledger: Ledger, S: Settings, el: Elastic) -> Findings:
    whole, killed = el.whole, el.killed
    ledger.add("elastic_restarts", "torchrun restarted the group once after the SIGKILL (each rank's restart count, "
               "measured)", min(r.restarts for r in killed), approx(1, abs=0), kind="measured", detail=True)
    same = killed[0].digest == whole[0].digest and killed[0].losses == whole[0].losses
    ledger.add("elastic_bitwise", "A rank SIGKILLed, the group restarted by torchrun: the run's final parameters and "
               "every loss equal the uninterrupted run's bitwise (measured)", same, is_true(), kind="measured")
    every = max(1, S.elastic_steps // 4)
    return Findings([
        "Yes: after rank 1's SIGKILL, torchrun restarted both ranks; they resumed from the last checkpoint and "
        + ("finished bitwise equal to the uninterrupted run." if same else
           "finished, but not equal to the uninterrupted run."),
    ], [
        f"Rank 1 killed itself before step {S.kill_at}; torchrun stopped rank 0 and started both again (restart count "
        f"{killed[0].restarts}).",
        f"The new ranks resumed from step {killed[0].resumed_from}: one checkpoint every {every} steps.",
    ])
