"""Lesson 07 — data parallelism: naive all-reduce, DDP, no_sync, buckets and the ring, on real ranks.

The functions taking `config: dict` run inside ranks (labtools.dist.launch imports them by name); the
rest runs in the notebook. Experiments for notebooks/07_data_parallel.ipynb.
"""

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass

import ipywidgets as W
import plotly.graph_objects as go
import torch
import torch.distributed as dist
from plotly.subplots import make_subplots
from torch.nn.parallel import DistributedDataParallel as DDP

from labtools import data, plots
from labtools.claims import Ledger, approx, at_least, at_most, is_true
from labtools.dist import device, launch, rank, report_progress, world_size
from labtools.dist.comm import DDPCommCounter, ring_all_reduce, ring_bytes
from labtools.model import GPT, GPTConfig
from labtools.optim import param_groups
from labtools.profiles import as_config, check_range, resolve
from labtools.widgets import Panel, RunCache


@dataclass(frozen=True)
class Settings:
    profile: str
    n_layer: int
    n_embd: int
    block_size: int
    batch_size: int        # per rank
    steps: int             # training steps of the DDP-vs-single-process comparison
    accum_k: int           # micro-batches per step in the accumulation experiment
    world_sizes: tuple     # ranks for the equivalence launches
    lr: float = 3e-3
    seed: int = 0

    def __post_init__(self):
        check_range("STEPS", self.steps, 1, 10_000, int)
        check_range("BATCH_SIZE", self.batch_size, 1, 1024, int)
        check_range("ACCUM_K", self.accum_k, 2, 64, int)
        check_range("SEED", self.seed, 0, 2**31 - 1, int)
        if not self.world_sizes or min(self.world_sizes) < 1:
            raise ValueError(f"WORLD_SIZES must be positive ints, got {self.world_sizes!r}")


PROFILES = {
    "smoke": Settings("smoke", n_layer=2, n_embd=64, block_size=64, batch_size=8, steps=15, accum_k=4,
                      world_sizes=(2, 4)),
    "cpu": Settings("cpu", n_layer=2, n_embd=64, block_size=64, batch_size=8, steps=60, accum_k=4, world_sizes=(2, 4)),
    "gpu": Settings("gpu", n_layer=6, n_embd=384, block_size=256, batch_size=16, steps=200, accum_k=4,
                    world_sizes=(2, 4)),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


# --- inside a rank ---------------------------------------------------------------------------------------------

def _model(cfg: dict) -> GPT:
    torch.manual_seed(cfg["seed"])  # every rank starts from the same weights
    vocab = data.text().vocab_size
    return GPT(GPTConfig(vocab_size=vocab, block_size=cfg["block_size"], n_layer=cfg["n_layer"], n_head=4,
                         n_embd=cfg["n_embd"])).to(device())


def _global_batch(cfg: dict, g: torch.Generator, rows: int):
    """The same global batch on every rank (same generator); each rank then takes its own rows."""
    X, Y = data.text().batch("train", rows, cfg["block_size"], g)
    return X.to(device()), Y.to(device())


def naive_data_parallel_grads(model: torch.nn.Module, X: torch.Tensor, Y: torch.Tensor) -> None:
    """Data parallelism written out: each rank back-propagates its own shard, then every gradient is summed
    over the ranks (all_reduce) and divided by the number of ranks — the gradient of the mean loss over the
    global batch. One collective per parameter: DDP does the same arithmetic, bucketed and overlapped."""
    _, loss = model(X, Y)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # SUM over ranks
        p.grad /= world_size()


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def equivalence(cfg: dict) -> dict:
    """N ranks × batch B against one process × batch N·B: gradients (naive all-reduce and DDP), the ring
    all-reduce against dist.all_reduce, and a short training run of each (loss per step)."""
    N, r, B = world_size(), rank(), cfg["batch_size"]
    g = torch.Generator().manual_seed(cfg["seed"])
    X, Y = _global_batch(cfg, g, N * B)
    mine = slice(r * B, (r + 1) * B)

    reference = _model(cfg)  # one process, the whole global batch
    reference(X, Y)[1].backward()
    ref_grads = [p.grad.clone() for p in reference.parameters()]

    naive = _model(cfg)
    naive_data_parallel_grads(naive, X[mine], Y[mine])
    naive_diff = _max_diff([p.grad for p in naive.parameters()], ref_grads)

    counter = DDPCommCounter()
    ddp = DDP(_model(cfg))
    ddp.register_comm_hook(None, counter.hook)
    ddp(X[mine], Y[mine])[1].backward()
    ddp_diff = _max_diff([p.grad for p in ddp.parameters()], ref_grads)
    grad_bytes = sum(p.numel() * p.element_size() for p in ddp.parameters())

    local = torch.cat([p.grad.flatten() for p in naive.parameters()]) * N  # the summed gradient, once more
    ring = local.clone()
    sent = ring_all_reduce(ring)
    torch_sum = local.clone()
    dist.all_reduce(torch_sum)
    out = {"naive_max_diff": naive_diff, "ddp_max_diff": ddp_diff,
           "ring_max_diff": (ring - torch_sum).abs().max().item(),
           "ring_bytes_sent": sent, "ring_bytes_formula": ring_bytes(local.numel() * local.element_size(), N),
           "grad_bytes": grad_bytes, "ddp_allreduce_bytes": counter.bytes, "ddp_buckets": counter.calls}
    out.update(_train_pair(cfg, N, r, B))
    return out


def _train_pair(cfg: dict, N: int, r: int, B: int) -> dict:
    """cfg['steps'] AdamW steps with DDP (each rank its B rows), and on rank 0 the same steps in one process."""
    steps = cfg["steps"]
    model = DDP(_model(cfg))
    opt = torch.optim.AdamW(param_groups(model.module, 0.1), lr=cfg["lr"], betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    losses = []
    for step in range(steps):
        X, Y = _global_batch(cfg, g, N * B)
        _, loss = model(X[r * B:(r + 1) * B], Y[r * B:(r + 1) * B])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(global_loss.item() / N)
        report_progress(step + 1, 2 * steps, "DDP")
    single = []
    if r == 0:
        ref = _model(cfg)
        opt = torch.optim.AdamW(param_groups(ref, 0.1), lr=cfg["lr"], betas=(0.9, 0.95))
        g = torch.Generator().manual_seed(cfg["seed"] + 1)
        for step in range(steps):
            X, Y = _global_batch(cfg, g, N * B)
            _, loss = ref(X, Y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            single.append(loss.item())
            report_progress(steps + step + 1, 2 * steps, "one process")
    dist.barrier()
    return {"ddp_losses": losses, "single_losses": single}


def accumulation(cfg: dict) -> dict:
    """Gradient accumulation under DDP: all-reduces per step with and without no_sync(), the gradient with
    the right and the wrong loss normalisation, and buckets per step for several bucket_cap_mb."""
    N, r, B, k = world_size(), rank(), cfg["batch_size"], cfg["accum_k"]
    g = torch.Generator().manual_seed(cfg["seed"])
    X, Y = _global_batch(cfg, g, N * B * k)  # k micro-batches of B rows per rank

    def micro(i):
        rows = slice((i * N + r) * B, (i * N + r + 1) * B)
        return X[rows], Y[rows]

    reference = _model(cfg)
    reference(X, Y)[1].backward()  # one process, all N·B·k rows: the gradient accumulation must reproduce
    ref_grads = [p.grad.clone() for p in reference.parameters()]

    out = {}
    for name, use_no_sync, normalize in (("no_sync", True, True), ("sync_every_micro_batch", False, True),
                                         ("no_sync_sum_bug", True, False)):
        counter = DDPCommCounter()
        model = DDP(_model(cfg))
        model.register_comm_hook(None, counter.hook)
        for i in range(k):
            last = i == k - 1
            ctx = model.no_sync() if use_no_sync and not last else nullcontext()
            with ctx:  # inside no_sync() gradients accumulate locally; the last micro-batch syncs them all
                _, loss = model(*micro(i))
                (loss / k if normalize else loss).backward()
        grads = [p.grad for p in model.parameters()]
        norm = torch.linalg.vector_norm(torch.cat([x.flatten() for x in grads])).item()
        ref_norm = torch.linalg.vector_norm(torch.cat([x.flatten() for x in ref_grads])).item()
        out[name] = {"allreduce_calls": counter.calls, "allreduce_bytes": counter.bytes,
                     "max_diff": _max_diff(grads, ref_grads), "norm_ratio": norm / ref_norm}
    buckets = {}
    for cap in cfg["bucket_caps_mb"]:
        counter = DDPCommCounter()
        model = DDP(_model(cfg), bucket_cap_mb=cap)
        model.register_comm_hook(None, counter.hook)
        for step in range(2):  # DDP re-builds its buckets after the first backward: count the second
            counter.reset()
            model(*micro(0))[1].backward()
        buckets[str(cap)] = {"buckets": counter.calls, "bucket_bytes": counter.bucket_bytes}
    out["buckets"] = buckets
    out["grad_bytes"] = sum(p.numel() * p.element_size() for p in reference.parameters())
    return out


def panel_run(cfg: dict) -> dict:
    """The panel's run: DDP with accumulation (no_sync) and a bucket size; loss, all-reduces and time per step."""
    N, r, B, k = world_size(), rank(), cfg["batch_size"], cfg["accum_k"]
    model = DDP(_model(cfg), bucket_cap_mb=cfg["bucket_cap_mb"])
    counter = DDPCommCounter()
    model.register_comm_hook(None, counter.hook)
    opt = torch.optim.AdamW(param_groups(model.module, 0.1), lr=cfg["lr"], betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    losses, calls, seconds = [], [], []
    for step in range(cfg["steps"]):
        t0 = time.perf_counter()
        counter.reset()
        X, Y = _global_batch(cfg, g, N * B * k)
        total = 0.0
        for i in range(k):
            rows = slice((i * N + r) * B, (i * N + r + 1) * B)
            ctx = model.no_sync() if i < k - 1 else nullcontext()
            with ctx:
                _, loss = model(X[rows], Y[rows])
                (loss / k).backward()
            total += loss.item() / k
        opt.step()
        opt.zero_grad(set_to_none=True)
        t = torch.tensor([total], device=device())
        dist.all_reduce(t)
        losses.append(t.item() / N)
        calls.append(counter.calls)
        seconds.append(time.perf_counter() - t0)
        report_progress(step + 1, cfg["steps"])
    return {"losses": losses, "allreduce_calls": calls, "seconds": seconds,
            "tokens_per_step": N * B * k * cfg["block_size"]}


# --- in the notebook ------------------------------------------------------------------------------------------

def run_equivalence(S: Settings, world: int) -> list[dict]:
    return launch("lessons.data_parallel:equivalence", world, as_config(S, "world_sizes"),
                  desc=f"equivalence × {world}")


def run_accumulation(S: Settings, world: int = 2) -> list[dict]:
    return launch("lessons.data_parallel:accumulation", world,
                  as_config(S, "world_sizes", bucket_caps_mb=[0.01, 0.05, 25]),
                  desc=f"accumulation × {world}")


def equivalence_figure(results: dict[int, list[dict]]) -> go.Figure:
    fig = go.Figure()
    for i, (world, res) in enumerate(results.items()):
        r0 = res[0]
        fig.add_trace(go.Scatter(y=r0["single_losses"], mode="lines", name=f"one process, batch {world}·B",
                                 line=dict(color=plots.color(i), width=4), opacity=0.35))
        fig.add_trace(go.Scatter(y=r0["ddp_losses"], mode="lines+markers", name=f"DDP, {world} ranks × B",
                                 line=dict(color=plots.color(i), dash="dot"), marker=dict(size=5)))
    plots._layout(fig, "Training loss: DDP on N ranks vs one process on the N-times batch", "step", "loss")
    return fig


def equivalence_table(results: dict[int, list[dict]]) -> go.Figure:
    rows = []
    for world, res in results.items():
        worst = lambda key: max(r[key] for r in res)  # noqa: E731 - the worst rank
        curve = max(abs(a - b) for a, b in zip(res[0]["ddp_losses"], res[0]["single_losses"]))
        rows.append((f"{world} ranks ({res[0]['dist']['backend']}, {res[0]['dist']['device']})",
                     f"{worst('naive_max_diff'):.1e}", f"{worst('ddp_max_diff'):.1e}", f"{worst('ring_max_diff'):.1e}",
                     f"{curve:.1e}"))
    return plots.table(("run", "naive all-reduce: max |Δg|", "DDP: max |Δg|", "ring vs dist.all_reduce",
                        "loss curves: max |Δ|"), rows, title="Against one process on the whole batch")


def accumulation_figure(acc: list[dict], k: int) -> go.Figure:
    a = acc[0]
    names = {"no_sync": "no_sync() on k−1", "sync_every_micro_batch": "no no_sync()", "no_sync_sum_bug": "loss not ÷ k"}
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"all-reduce calls per step (k = {k} micro-batches)",
                                                        "‖gradient‖ ÷ ‖one-process gradient‖"))
    fig.add_trace(go.Bar(x=list(names.values()), y=[a[n]["allreduce_calls"] for n in names],
                         marker_color=plots.color(0),
                         texttemplate="%{y}", showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(x=list(names.values()), y=[a[n]["norm_ratio"] for n in names], marker_color=plots.color(1),
                         texttemplate="%{y:.2f}", showlegend=False), row=1, col=2)
    fig.update_layout(template=plots.TEMPLATE, height=380, margin=dict(l=50, r=20, t=50, b=50))
    return fig


def buckets_figure(acc: list[dict]) -> go.Figure:
    b = acc[0]["buckets"]
    caps = list(b)
    return plots.bars([f"{c} MB" for c in caps], {"buckets all-reduced per step": [b[c]["buckets"] for c in caps]},
                      title=f"DDP buckets vs bucket_cap_mb (gradients: {acc[0]['grad_bytes'] / 2**20:.2f} MiB)",
                      yaxis="buckets")


def ddp_panel(S: Settings, seed_result: tuple | None = None) -> tuple[Panel, RunCache]:
    """World size, accumulation and bucket size → a DDP run (a real launch, cached)."""
    def run(world, accum_k, bucket_cap_mb):
        res = launch("lessons.data_parallel:panel_run", world,
                     as_config(S, "world_sizes", accum_k=accum_k, bucket_cap_mb=bucket_cap_mb,
                               steps=max(5, S.steps // 2)),
                     desc=f"DDP × {world}, k={accum_k}")
        return res[0]

    cache = RunCache(run)
    if seed_result is not None:
        key, value = seed_result
        cache.store[cache.key(key)] = value

    def draw(world, accum_k, bucket_cap_mb):
        r = cache(world=world, accum_k=accum_k, bucket_cap_mb=bucket_cap_mb)
        fig = make_subplots(rows=1, cols=2, subplot_titles=(
            f"loss ({r['tokens_per_step']:,} tokens/step = {S.batch_size} seq × {S.block_size} × {world} ranks × "
            f"{accum_k})", "all-reduce calls per step"))
        fig.add_trace(go.Scatter(y=r["losses"], mode="lines+markers", showlegend=False), row=1, col=1)
        fig.add_trace(go.Bar(y=r["allreduce_calls"], showlegend=False, marker_color=plots.color(1)), row=1, col=2)
        fig.update_layout(template=plots.TEMPLATE, height=380, margin=dict(l=50, r=20, t=50, b=50),
                          title=f"median {statistics.median(r['seconds']) * 1e3:.0f} ms per step")
        return fig

    controls = {
        "world": W.SelectionSlider(options=[1, 2, 3, 4], value=2, description="ranks", continuous_update=False),
        "accum_k": W.SelectionSlider(options=[1, 2, 4, 8], value=1, description="accumulation",
                                     continuous_update=False),
        "bucket_cap_mb": W.SelectionSlider(options=[0.01, 0.05, 1.0, 25.0], value=25.0, description="bucket MB",
                                           continuous_update=False),
    }
    return Panel(draw, controls, title="A DDP run of your choice (each new setting launches once)"), cache


# --- words and claims ---------------------------------------------------------------------------------------------

def equivalence_summary(results: dict[int, list[dict]]) -> str:
    parts = []
    for world, res in results.items():
        r0 = res[0]
        parts.append(f"**{world} ranks** ({r0['dist']['backend']} on {r0['dist']['device']}): gradients match one "
                     "process "
                     f"to {max(r['ddp_max_diff'] for r in res):.1e} (DDP) and "
                     f"{max(r['naive_max_diff'] for r in res):.1e} (naive); each rank sent {r0['ring_bytes_sent']:,} "
                     f"bytes in the ring all-reduce of {r0['grad_bytes']:,} bytes of gradients — 2(N−1)/N × that = "
                     f"{r0['ring_bytes_formula']:,.0f}. The loss curves differ by at most "
                     f"{max(abs(a - b) for a, b in zip(r0['ddp_losses'], r0['single_losses'])):.1e}: the all-reduce "
                     "adds the same numbers in another order, and AdamW amplifies last-bit differences over many "
                     "steps, as lesson 03 saw.")
    return " ".join(parts)


def accumulation_summary(acc: list[dict], k: int) -> str:
    a = acc[0]
    b = a["buckets"]
    return (f"With `no_sync()` on the first {k - 1} micro-batches DDP all-reduced "
            f"{a['no_sync']['allreduce_calls']} bucket(s) per step; without it, "
            f"{a['sync_every_micro_batch']['allreduce_calls']} — the same gradients (max |Δ| "
            f"{a['sync_every_micro_batch']['max_diff']:.1e}), {k}× the communication. Forgetting to divide each "
            f"micro-batch's loss by k gives gradients {a['no_sync_sum_bug']['norm_ratio']:.2f}× "
            f"too large. Buckets per step: " + ", ".join(f"{v['buckets']} at {c} MB" for c, v in b.items()) +
            ": DDP groups gradients into buckets of up to bucket_cap_mb and starts each all-reduce as soon as its "
            "bucket is full, overlapping communication with the rest of backward.")


def claims(S: Settings, *, eq: dict[int, list[dict]], acc: list[dict]) -> Ledger:
    ledger = Ledger("07_data_parallel")
    for world, res in eq.items():
        ledger.add(f"ddp_{world}", f"{world} ranks × B ≡ one process × {world}B: DDP gradients (max |Δ| over ranks)",
                   max(r["ddp_max_diff"] for r in res), at_most(1e-6))
        ledger.add(f"naive_{world}", f"… and the naive all-reduce written out ({world} ranks)",
                   max(r["naive_max_diff"] for r in res), at_most(1e-6))
        curve = max(abs(a - b) for a, b in zip(res[0]["ddp_losses"], res[0]["single_losses"]))
        ledger.add(f"curve_{world}", f"Loss curves of DDP ({world} ranks) and one process agree over {S.steps} steps "
                   "(max |Δ loss|; rounding differs, so the runs drift apart slowly)", curve, at_most(0.01))
        ledger.add(f"ring_{world}", f"The ring all-reduce written out equals dist.all_reduce ({world} ranks, max |Δ|)",
                   max(r["ring_max_diff"] for r in res), at_most(1e-5))
        r0 = res[0]
        ledger.add(f"ring_bytes_{world}", f"Each rank sends 2(N−1)/N × the gradient bytes in a ring all-reduce "
                   f"(N = {world}; sent ÷ formula)", r0["ring_bytes_sent"] / r0["ring_bytes_formula"],
                   approx(1.0, rel=0.01))
        ledger.add(f"backend_{world}", "The launch says which backend and devices it used",
                   all("backend" in r["dist"] and "device" in r["dist"] for r in res), is_true())
    a = acc[0]
    k = S.accum_k
    ledger.add("accum_equal", f"{k} micro-batches with no_sync() ≡ one batch of {k}× (max |Δg|)",
               a["no_sync"]["max_diff"], at_most(1e-6))
    ledger.add("no_sync_saves", f"Without no_sync() DDP all-reduces {k}× as often (calls without ÷ with)",
               a["sync_every_micro_batch"]["allreduce_calls"] / a["no_sync"]["allreduce_calls"], approx(k, abs=1e-9))
    ledger.add("sum_bug", f"Not dividing the micro-batch loss by k makes the gradient k = {k}× too large",
               a["no_sync_sum_bug"]["norm_ratio"], approx(k, rel=1e-4))
    b = a["buckets"]
    caps = list(b)
    ledger.add("buckets", "Smaller bucket_cap_mb → more buckets per step (smallest cap ÷ largest cap)",
               b[caps[0]]["buckets"] / b[caps[-1]]["buckets"], at_least(2))
    return ledger
