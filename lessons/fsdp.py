"""Lesson 08 — FSDP and ZeRO: sharded model states, measured per rank against the memory prediction, and what
sharding costs in communication.

The functions taking `config: dict` run inside ranks (labtools.dist.launch); the rest runs in the notebook.
Experiments for notebooks/08_fsdp_zero.ipynb.
"""

import warnings
from dataclasses import dataclass

import plotly.graph_objects as go
import torch
import torch.distributed as dist
from plotly.subplots import make_subplots
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from labtools import data, plots
from labtools.claims import Ledger, approx, at_most, is_true
from labtools.dist import device, launch, rank, report_progress, world_size
from labtools.dist.comm import CollectiveCounter, DDPCommCounter
from labtools.memory import estimate
from labtools.model import GPT, GPTConfig
from labtools.optim import AdamW
from labtools.profiles import as_config, check_range, resolve


@dataclass(frozen=True)
class Settings:
    profile: str
    n_layer: int
    n_embd: int
    block_size: int
    batch_size: int      # per rank
    steps: int           # training steps of the FSDP vs DDP comparison
    world_sizes: tuple   # ranks for the sharding measurements
    lr: float = 3e-3
    seed: int = 0

    def __post_init__(self):
        check_range("STEPS", self.steps, 1, 10_000, int)
        check_range("BATCH_SIZE", self.batch_size, 1, 1024, int)
        check_range("SEED", self.seed, 0, 2**31 - 1, int)
        if not self.world_sizes or min(self.world_sizes) < 2:
            raise ValueError(f"WORLD_SIZES must be ints >= 2 (sharding needs ranks), got {self.world_sizes!r}")


PROFILES = {
    "smoke": Settings("smoke", n_layer=2, n_embd=64, block_size=64, batch_size=8, steps=10, world_sizes=(2, 4)),
    "cpu": Settings("cpu", n_layer=2, n_embd=64, block_size=64, batch_size=8, steps=40, world_sizes=(2, 4)),
    "gpu": Settings("gpu", n_layer=6, n_embd=384, block_size=256, batch_size=16, steps=200, world_sizes=(2, 4)),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)


# --- inside a rank ---------------------------------------------------------------------------------------------

STRATEGIES = ("DDP (no sharding)", "ZeRO-1: DDP + ZeroRedundancyOptimizer", "ZeRO-2: fully_shard, no reshard",
              "ZeRO-3: fully_shard", "ZeRO-3: fully_shard + bf16 params")
ZERO_STAGE = dict(zip(STRATEGIES, (0, 1, 2, 3, 3)))


def _model(cfg: dict) -> GPT:
    torch.manual_seed(cfg["seed"])
    return GPT(GPTConfig(vocab_size=data.text().vocab_size, block_size=cfg["block_size"], n_layer=cfg["n_layer"],
                         n_head=4, n_embd=cfg["n_embd"])).to(device())


def _local_bytes(tensors) -> int:
    """Bytes this rank holds: a DTensor counts its local shard."""
    total = 0
    for t in tensors:
        if t is not None:
            t = t.to_local() if isinstance(t, DTensor) else t
            total += t.numel() * t.element_size()
    return total


def _shard(model: GPT, mesh, reshard: bool, mp: bool) -> GPT:
    """FSDP2: each block is a unit (its parameters gathered together), then the root (embeddings, head)."""
    kw = dict(mesh=mesh, reshard_after_forward=reshard)
    if mp:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.transformer.h:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    return model


def _wrap(cfg: dict, strategy: str, mesh):
    """(the module to call, its parameters, an optimizer) for one strategy. Optimizers are labtools' AdamW,
    whose state is exactly two tensors per parameter (torch's also keeps a step tensor each)."""
    model = _model(cfg)
    if strategy.startswith("DDP"):
        wrapped = DDP(model)
        return wrapped, model, AdamW(model.parameters(), lr=cfg["lr"])
    if strategy.startswith("ZeRO-1"):
        wrapped = DDP(model)
        return wrapped, model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=AdamW, lr=cfg["lr"])
    reshard = not strategy.startswith("ZeRO-2")
    sharded = _shard(model, mesh, reshard=reshard, mp="bf16" in strategy)
    return sharded, sharded, AdamW(sharded.parameters(), lr=cfg["lr"])


def _optimizer_bytes(opt) -> int:
    inner = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt  # ZeRO-1: this rank's partition
    return _local_bytes(v for s in inner.state.values() for v in s.values() if torch.is_tensor(v))


def sharding(cfg: dict) -> dict:
    """Per strategy, on this rank: bytes of parameters (at rest, and held between forward and backward),
    gradients and optimizer state, and the collectives of one training step (calls, input bytes)."""
    N = world_size()
    mesh = init_device_mesh(device().type, (N,))
    B, r = cfg["batch_size"], rank()
    g = torch.Generator().manual_seed(cfg["seed"])
    X, Y = data.text().batch("train", N * B, cfg["block_size"], g)
    X, Y = X[r * B:(r + 1) * B].to(device()), Y[r * B:(r + 1) * B].to(device())
    out = {}
    for i, strategy in enumerate(STRATEGIES):
        module, params_of, opt = _wrap(cfg, strategy, mesh)
        ddp_counter = DDPCommCounter()
        if isinstance(module, DDP):
            module.register_comm_hook(None, ddp_counter.hook)
        with CollectiveCounter() as counter:
            _, loss = module(X, Y)
            held = _local_bytes(params_of.parameters())  # between forward and backward
            loss.backward()
            grads = _local_bytes(p.grad for p in params_of.parameters())
            opt.step()  # ZeRO-1 broadcasts each updated partition from its owner here
        calls, sent = dict(counter.calls), dict(counter.bytes)
        if ddp_counter.calls:  # DDP's all-reduces run from C++: counted by its hook instead
            calls["all_reduce"], sent["all_reduce"] = ddp_counter.calls, ddp_counter.bytes
        out[strategy] = {"params": _local_bytes(params_of.parameters()), "held_after_forward": held, "grads": grads,
                         "optimizer": _optimizer_bytes(opt), "calls": calls, "input_bytes": sent,
                         "n_params": sum(p.numel() for p in _model(cfg).parameters())}
        report_progress(i + 1, len(STRATEGIES), strategy)
    return out


def fsdp1(cfg: dict) -> dict:
    """FSDP1's sharding strategies (FlatParameter per unit): bytes of parameters and gradients on this rank."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from labtools.model import Block
    N, r, B = world_size(), rank(), cfg["batch_size"]
    g = torch.Generator().manual_seed(cfg["seed"])
    X, Y = data.text().batch("train", N * B, cfg["block_size"], g)
    X, Y = X[r * B:(r + 1) * B].to(device()), Y[r * B:(r + 1) * B].to(device())
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # FSDP1 is deprecated in favour of fully_shard
        for name in ("NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD"):
            model = FSDP(_model(cfg), sharding_strategy=getattr(ShardingStrategy, name), device_id=device(),
                         auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=False)
            model(X, Y)[1].backward()
            out[name] = {"params": _local_bytes(model.parameters()),
                         "grads": _local_bytes(p.grad for p in model.parameters())}
    return out


def equivalence(cfg: dict) -> dict:
    """FSDP2 (ZeRO-3) and DDP trained on the same data: losses per step, and the first step's gradients against
    one process on the whole batch."""
    N, r, B = world_size(), rank(), cfg["batch_size"]
    mesh = init_device_mesh(device().type, (N,))
    out = {}
    for name in ("DDP", "FSDP"):
        model = _model(cfg)
        module = DDP(model) if name == "DDP" else _shard(model, mesh, reshard=True, mp=False)
        opt = AdamW(module.parameters(), lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=0.1)
        g = torch.Generator().manual_seed(cfg["seed"] + 1)
        losses, first_grads = [], None
        for step in range(cfg["steps"]):
            X, Y = data.text().batch("train", N * B, cfg["block_size"], g)
            _, loss = module(X[r * B:(r + 1) * B].to(device()), Y[r * B:(r + 1) * B].to(device()))
            loss.backward()
            if step == 0:
                first_grads = [(p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
                               for p in module.parameters()]
                if step == 0 and r == 0:
                    ref = _model(cfg)
                    ref(X.to(device()), Y.to(device()))[1].backward()
                    out[f"{name}_grad_max_diff"] = max((a - p.grad).abs().max().item()
                                                       for a, p in zip(first_grads, ref.parameters()))
            opt.step()
            opt.zero_grad(set_to_none=True)
            t = loss.detach().clone()
            dist.all_reduce(t)
            losses.append(t.item() / N)
            report_progress(step + 1 + (cfg["steps"] if name == "FSDP" else 0), 2 * cfg["steps"], name)
        out[f"{name}_losses"] = losses
    return out


# --- in the notebook ---------------------------------------------------------------------------------------------

def run_sharding(S: Settings, world: int) -> list[dict]:
    return launch("lessons.fsdp:sharding", world, as_config(S, "world_sizes"), desc=f"sharding × {world}")


def run_fsdp1(S: Settings, world: int = 2) -> list[dict]:
    return launch("lessons.fsdp:fsdp1", world, as_config(S, "world_sizes"), desc=f"FSDP1 × {world}")


def run_equivalence(S: Settings, world: int = 2) -> list[dict]:
    return launch("lessons.fsdp:equivalence", world, as_config(S, "world_sizes"), desc=f"FSDP vs DDP × {world}")


def predicted(n_params: int, strategy: str, world: int) -> dict:
    """labtools.memory.estimate for the same model: fp32 weights and gradients, AdamW, the strategy's ZeRO stage."""
    b = estimate(n_params, precision="fp32", optimizer="adamw", zero_stage=ZERO_STAGE[strategy], dp=world)
    return {"params": b.parts.get("weights", 0), "grads": b.parts.get("gradients", 0),
            "optimizer": b.parts.get("optimizer state", 0)}


def sharding_figure(results: dict[int, list[dict]]) -> go.Figure:
    worlds = list(results)
    fig = make_subplots(rows=1, cols=len(worlds), subplot_titles=[f"{w} ranks (rank 0)" for w in worlds])
    for col, w in enumerate(worlds, 1):
        r0 = results[w][0]
        names = [s.split(":")[0] if ":" in s else s for s in STRATEGIES]
        names = [f"{n}{' bf16' if 'bf16' in s else ''}" for n, s in zip(names, STRATEGIES)]
        for i, (key, label) in enumerate((("params", "parameters at rest"),
                                          ("held_after_forward", "parameters held fwd→bwd"),
                                          ("grads", "gradients"), ("optimizer", "optimizer state"))):
            fig.add_trace(go.Bar(x=names, y=[r0[s][key] / 2**10 for s in STRATEGIES], name=label,
                                 marker_color=plots.color(i), showlegend=col == 1), row=1, col=col)
    fig.update_yaxes(title_text="KiB on this rank", row=1, col=1)
    fig.update_layout(template=plots.TEMPLATE, height=430, barmode="group", margin=dict(l=60, r=20, t=50, b=50),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def prediction_table(results: dict[int, list[dict]]) -> go.Figure:
    rows = []
    for w, res in results.items():
        for s in STRATEGIES:
            if "bf16" in s:
                continue
            m = res[0][s]
            p = predicted(m["n_params"], s, w)
            held = "params held fwd→bwd" if ZERO_STAGE[s] == 2 else "params"
            measured_params = m["held_after_forward"] if ZERO_STAGE[s] == 2 else m["params"]
            rows.append((f"{w} ranks", s, f"{measured_params:,} / {p['params']:,}", f"{m['grads']:,} / {p['grads']:,}",
                         f"{m['optimizer']:,} / {p['optimizer']:,}", held))
    return plots.table(("", "strategy", "params: measured / predicted", "grads", "optimizer state", "params counted"),
                       rows, title="Rank 0's bytes, measured from its local tensors / labtools.memory.estimate",
                       row_height=34)


def traffic(world: int, strategy_result: dict) -> float:
    """Bytes this rank sends for one step's collectives under ring algorithms: an all-gather whose input is
    s bytes sends (N−1)·s; a reduce-scatter of an M-byte input (N−1)/N·M; an all-reduce 2(N−1)/N·M; broadcasts
    of partitions that add up to M (every rank calls each one), (N−1)/N·M on average."""
    N = world
    b = strategy_result["input_bytes"]
    return ((N - 1) * b.get("all_gather_single", 0) + (N - 1) * b.get("all_gather_into_tensor", 0)
            + (N - 1) / N * (b.get("reduce_scatter_single", 0) + b.get("reduce_scatter_tensor", 0))
            + 2 * (N - 1) / N * b.get("all_reduce", 0) + (N - 1) / N * b.get("broadcast", 0))


def traffic_figure(results: dict[int, list[dict]]) -> go.Figure:
    w = max(results)
    r0 = results[w][0]
    base = traffic(w, r0[STRATEGIES[0]])
    ratios = [traffic(w, r0[s]) / base for s in STRATEGIES]
    fig = plots.bars(list(STRATEGIES), {"bytes sent per step ÷ DDP's": ratios},
                     title=f"Communication per step, {w} ranks, relative to DDP's all-reduce", yaxis="× DDP")
    fig.update_traces(texttemplate="%{y:.2f}×")
    return fig


def equivalence_figure(eq: list[dict]) -> go.Figure:
    r0 = eq[0]
    fig = go.Figure([go.Scatter(y=r0["DDP_losses"], mode="lines", name="DDP", line=dict(width=4), opacity=0.4),
                     go.Scatter(y=r0["FSDP_losses"], mode="lines+markers", name="FSDP2 (ZeRO-3)",
                                line=dict(dash="dot"))])
    plots._layout(fig, "Training loss: FSDP vs DDP on the same data", "step", "loss")
    return fig


# --- words and claims -----------------------------------------------------------------------------------------------

def sharding_summary(results: dict[int, list[dict]]) -> str:
    parts = []
    for w, res in results.items():
        r0 = res[0]
        d, z3 = r0[STRATEGIES[0]], r0["ZeRO-3: fully_shard"]
        parts.append(f"With {w} ranks, rank 0 holds {z3['params'] / d['params']:.3f} of the parameters, "
                     f"{z3['grads'] / d['grads']:.3f} of the gradients and {z3['optimizer'] / d['optimizer']:.3f} of "
                     f"the optimizer state that DDP holds (1/N = {1 / w:.3f}).")
    r0 = results[min(results)][0]
    z2, z3 = r0["ZeRO-2: fully_shard, no reshard"], r0["ZeRO-3: fully_shard"]
    mp = r0["ZeRO-3: fully_shard + bf16 params"]
    parts.append(f"Between forward and backward, resharding keeps {z3['held_after_forward']:,} bytes of parameters, "
                 f"not resharding {z2['held_after_forward']:,} (the whole model, unsharded, until backward). With bf16 "
                 f"parameters the all-gathers carry {mp['input_bytes'].get('all_gather_single', 0):,} bytes instead of "
                 f"{z3['input_bytes'].get('all_gather_single', 0):,}; the stored shards, gradients and optimizer state "
                 f"stay fp32 ({mp['params']:,} bytes of parameters) and gradients are reduced in fp32.")
    return " ".join(parts)


def traffic_summary(results: dict[int, list[dict]]) -> str:
    w = max(results)
    r0 = results[w][0]
    base = traffic(w, r0[STRATEGIES[0]])
    z3, z2 = traffic(w, r0["ZeRO-3: fully_shard"]) / base, traffic(w, r0["ZeRO-2: fully_shard, no reshard"]) / base
    calls = r0["ZeRO-3: fully_shard"]["calls"]
    return (f"Per step, DDP all-reduces every gradient once: 2(N−1)/N · M bytes sent per rank. ZeRO-3 all-gathers the "
            "parameters in forward, again in backward (they were freed), and reduce-scatters the gradients — "
            f"{calls.get('all_gather_single', 0)} all-gathers and {calls.get('reduce_scatter_single', 0)} "
            f"reduce-scatters here, one per unit each time — for 3(N−1)/N · M: measured {z3:.2f}× DDP. Not resharding "
            f"saves the backward all-gather: {z2:.2f}×. PyTorch's ZeRO-1 (ZeroRedundancyOptimizer) keeps DDP's "
            "all-reduce and adds a broadcast of each updated partition from its owner: "
            f"{traffic(w, r0[STRATEGIES[1]]) / base:.2f}× (the ZeRO paper's own stage 1 reduce-scatters instead, for "
            "1×).")


def claims(S: Settings, *, shard: dict[int, list[dict]], fsdp1: list[dict], eq: list[dict]) -> Ledger:
    ledger = Ledger("08_fsdp_zero")
    for w, res in shard.items():
        z3 = [r["ZeRO-3: fully_shard"] for r in res]
        n = z3[0]["n_params"]
        full = 4 * n
        worst = max(abs(r[k] - full / w) for r in z3 for k in ("params", "grads")) / (full / w)
        ledger.add(f"z3_1overN_{w}", f"{w} ranks, fully_shard: each rank holds 1/N of parameters and gradients "
                   "(worst relative deviation over ranks: padding)", worst, at_most(0.05))
        ledger.add(f"z3_sum_{w}", f"… and the shards add up to the whole model ({w} ranks)",
                   sum(r["params"] for r in z3) == full, is_true())
        ledger.add(f"z3_opt_{w}", f"… and 1/N of AdamW's state: 2 × its parameter shard ({w} ranks)",
                   all(r["optimizer"] == 2 * r["params"] for r in z3), is_true())
        p = predicted(n, "ZeRO-3: fully_shard", w)
        ledger.add(f"z3_pred_{w}", f"Per-rank bytes equal labtools.memory's ZeRO-3 prediction (worst relative gap, "
                   f"{w} ranks)", max(abs(r[k] - p[k]) / p[k] for r in z3 for k in ("params", "grads", "optimizer")),
                   at_most(0.05))
        z1 = [r["ZeRO-1: DDP + ZeroRedundancyOptimizer"] for r in res]
        ledger.add(f"z1_sum_{w}", f"ZeRO-1 shards only the optimizer state: the partitions add up to the whole "
                   f"({w} ranks)", sum(r["optimizer"] for r in z1) == 8 * n and all(r["params"] == full for r in z1),
                   is_true())
    r0 = shard[min(shard)][0]
    z2, z3 = r0["ZeRO-2: fully_shard, no reshard"], r0["ZeRO-3: fully_shard"]
    ledger.add("reshard", "Without resharding, the whole unsharded model is held between forward and backward "
               "(held ÷ model bytes)", z2["held_after_forward"] / (4 * z2["n_params"]), approx(1.0, abs=1e-9))
    ledger.add("reshard_z3", "With it, only the shard (held ÷ model bytes × N)",
               z3["held_after_forward"] / (4 * z3["n_params"]) * min(shard), approx(1.0, rel=0.05))
    w = max(shard)
    rw = shard[w][0]
    base = traffic(w, rw[STRATEGIES[0]])
    ledger.add("traffic_z3", f"ZeRO-3 sends 1.5× DDP's bytes per step ({w} ranks, ring algorithms, measured inputs)",
               traffic(w, rw["ZeRO-3: fully_shard"]) / base, approx(1.5, rel=0.02))
    ledger.add("traffic_z2", "Without resharding, 1.0× (one all-gather saved)",
               traffic(w, rw["ZeRO-2: fully_shard, no reshard"]) / base, approx(1.0, rel=0.02))
    ledger.add("traffic_z1", "ZeroRedundancyOptimizer: DDP's all-reduce plus a broadcast of the updated partitions, "
               "1.5×", traffic(w, rw[STRATEGIES[1]]) / base, approx(1.5, rel=0.02))
    mp = rw["ZeRO-3: fully_shard + bf16 params"]
    ledger.add("mp_allgather", "bf16 parameters halve the all-gathered bytes (bf16 ÷ fp32)",
               mp["input_bytes"]["all_gather_single"] / rw["ZeRO-3: fully_shard"]["input_bytes"]["all_gather_single"],
               approx(0.5, abs=1e-9))
    ledger.add("mp_reduce_fp32", "… while gradients are still reduced in fp32 (reduce-scatter bytes unchanged)",
               mp["input_bytes"]["reduce_scatter_single"]
               == rw["ZeRO-3: fully_shard"]["input_bytes"]["reduce_scatter_single"],
               is_true())
    f1 = fsdp1[0]
    ledger.add("fsdp1_full", "FSDP1 FULL_SHARD and SHARD_GRAD_OP hold 1/N of the parameters at rest, NO_SHARD all "
               "(FULL_SHARD ÷ NO_SHARD × N)", f1["FULL_SHARD"]["params"] / f1["NO_SHARD"]["params"] * len(fsdp1),
               approx(1.0, rel=0.05))
    ledger.add("fsdp_grads", "FSDP's first-step gradients equal one process on the whole batch (max |Δ|)",
               eq[0]["FSDP_grad_max_diff"], at_most(1e-6))
    curve = max(abs(a - b) for a, b in zip(eq[0]["FSDP_losses"], eq[0]["DDP_losses"]))
    ledger.add("fsdp_curve", f"FSDP and DDP loss curves agree over {S.steps} steps (max |Δ loss|)", curve,
               at_most(0.01))
    ledger.note("traffic_x_ddp", {s: traffic(w, rw[s]) / base for s in STRATEGIES})
    ledger.note("fsdp1_rank0", f1)
    return ledger
