"""The training loop: one function whose step order is visible at a glance.

    for each step:
        for each of accum_steps micro-batches:
            forward under autocast -> loss / accum_steps -> backward (scaled for fp16)
        unscale (fp16) -> measure the global grad norm, clip -> optimizer step
        -> update the loss scaler -> zero_grad(set_to_none=True)

The learning rate is `cfg.lr * cfg.lr_schedule(step)`, a pure function of the step.
`train()` returns a History of plain columns that labtools.plots draws.
Introduced in notebooks/00_training_loop.ipynb.
"""

import dataclasses
import math
import shutil
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from labtools import checkpoint
from labtools.data import Corpus
from labtools.optim import param_groups
from labtools.progress import check_cancelled, progress
from labtools.resume import resume, save
from labtools.schedules import constant

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class TrainConfig:
    steps: int = 200                  # optimizer steps
    batch_size: int = 32              # sequences per micro-batch
    block_size: int | None = None     # tokens per sequence; None -> the model's block_size
    accum_steps: int = 1              # micro-batches per optimizer step
    accum_normalize: bool = True      # divide each micro-batch loss by accum_steps; False = the classic bug
    lr: float = 1e-3                  # peak learning rate (for the default optimizer)
    lr_schedule: Callable[[int], float] = constant  # step -> multiplier of every group's base lr
    weight_decay: float = 0.1         # for the default AdamW; biases and norms get none
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0     # max global grad norm; None -> measure but do not clip
    precision: str = "fp32"           # "fp32" | "bf16" | "fp16" (autocast; GradScaler for fp16)
    eval_every: int = 50              # steps between validation estimates (and at step 0 and the end)
    eval_batches: int = 10            # validation batches per estimate (the same batches each time)
    seed: int = 0                     # seeds batch sampling and dropout
    start_step: int = 0               # first step's number (resuming or branching a run): the schedule sees it
    checkpoint_dir: str | None = None  # save the whole training state here; resume from its latest() if any
    checkpoint_every: int = 0         # steps between checkpoints (0: none); the last step is always saved
    keep_checkpoints: int = 3         # newest checkpoints kept (older ones deleted once the new one verified)
    stop_at: int | None = None        # end the run after this step (an interruption), as if the process died
    progress: bool = True             # show a progress bar
    desc: str = "train"               # progress bar label

    def __post_init__(self):
        for name in ("steps", "batch_size", "accum_steps", "eval_every", "eval_batches"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainConfig.{name} must be an int >= 1, got {value!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainConfig.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not 0 < self.lr < math.inf:
            raise ValueError(f"TrainConfig.lr must be a finite number > 0, got {self.lr!r}")
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size < 1):
            raise ValueError(f"TrainConfig.block_size must be an int >= 1 or None, got {self.block_size!r}")
        if isinstance(self.weight_decay, bool) or not isinstance(self.weight_decay, (int, float)) \
                or not 0 <= self.weight_decay < math.inf:
            raise ValueError(f"TrainConfig.weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        if not callable(self.lr_schedule):
            raise ValueError(f"TrainConfig.lr_schedule must be a function step -> multiplier, got {self.lr_schedule!r}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"TrainConfig.betas must be two numbers in [0, 1), got {self.betas!r}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"TrainConfig.grad_clip must be > 0 or None, got {self.grad_clip!r}")
        if not isinstance(self.start_step, int) or self.start_step < 0:
            raise ValueError(f"TrainConfig.start_step must be an int >= 0, got {self.start_step!r}")
        for name in ("checkpoint_every", "keep_checkpoints"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (name == "keep_checkpoints"):
                raise ValueError(f"TrainConfig.{name} must be an int >= {int(name == 'keep_checkpoints')}, "
                                 f"got {value!r}")
        if self.checkpoint_every and self.checkpoint_dir is None:
            raise ValueError("TrainConfig.checkpoint_every needs a checkpoint_dir")
        if self.stop_at is not None and not (isinstance(self.stop_at, int)
                                             and self.start_step < self.stop_at <= self.start_step + self.steps):
            raise ValueError(f"TrainConfig.stop_at must be a step in ({self.start_step}, "
                             f"{self.start_step + self.steps}], got {self.stop_at!r}")


@dataclass
class History:
    """Plain per-step columns, plus validation estimates at val_step, plus callback columns."""
    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)          # mean training loss of the step's tokens
    lr: list[float] = field(default_factory=list)            # lr of the first param group
    grad_norm: list[float] = field(default_factory=list)     # global norm before clipping (unscaled)
    tokens_per_s: list[float] = field(default_factory=list)
    loss_scale: list[float] = field(default_factory=list)    # 1.0 unless a loss scaler is active
    skipped: list[bool] = field(default_factory=list)        # the scaler skipped this step (inf/nan)
    val_step: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    extra: dict[str, list] = field(default_factory=dict)     # columns a callback logs
    seconds: float = 0.0                                     # wall time of the whole run

    @property
    def final_val_loss(self) -> float:
        return self.val_loss[-1]

    def record(self, info: "StepInfo", skipped: bool, tokens_per_s: float) -> None:
        """Append one optimizer step's columns."""
        self.step.append(info.step)
        self.loss.append(info.loss)
        self.lr.append(info.lr)
        self.grad_norm.append(info.grad_norm)
        self.tokens_per_s.append(tokens_per_s)
        self.loss_scale.append(info.scale)
        self.skipped.append(skipped)
        for key, value in info.log.items():
            self.extra.setdefault(key, []).append(value)


@dataclass
class StepInfo:
    """What a callback sees after each optimizer step (gradients are still in place)."""
    step: int
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss: float
    grad_norm: float
    lr: float
    scale: float = 1.0                       # the loss scale the step ran at (1.0 without a scaler)
    log: dict = field(default_factory=dict)  # put {column: value} here to add History.extra columns


def autocast(device: torch.device, precision: str):
    """The autocast context for a precision ("fp32" -> no autocast)."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Corpus, split: str = "val", *, batches: int = 10,
             batch_size: int = 32, block_size: int | None = None, precision: str = "fp32",
             seed: int = 1234) -> float:
    """Mean loss over `batches` fixed batches (the same ones on every call with the same seed)."""
    device = next(model.parameters()).device
    block_size = block_size or model.config.block_size
    g = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    total = 0.0
    for _ in range(batches):
        X, Y = data.batch(split, batch_size, block_size, generator=g, device=device)
        with autocast(device, precision):
            _, loss = model(X, Y)
        total += loss.item()
    model.train(was_training)
    return total / batches


@dataclass
class _Run:
    """What train() sets up once and every step uses."""
    device: torch.device
    T: int                       # tokens per sequence
    g: torch.Generator           # batch sampling
    optimizer: torch.optim.Optimizer
    scaler: object
    base_lrs: list[float]        # each group's lr before the schedule's multiplier
    params: list[torch.nn.Parameter]
    clip: Callable[[list[torch.Tensor], float], object] | None = None  # (grads, max_norm) -> norm; None: torch's


def _setup(model: torch.nn.Module, data: Corpus, cfg: TrainConfig, optimizer, scaler, batch_fn) -> _Run:
    device = next(model.parameters()).device
    T = cfg.block_size or model.config.block_size
    if T > model.config.block_size:
        raise ValueError(f"TrainConfig.block_size ({T}) exceeds the model's block_size ({model.config.block_size})")
    if batch_fn is None and data.vocab_size > model.config.vocab_size:
        raise ValueError(f"the corpus {data.name!r} has {data.vocab_size} tokens but the model's vocabulary is "
                         f"{model.config.vocab_size}: build the model with vocab_size >= {data.vocab_size}")
    torch.manual_seed(cfg.seed + cfg.start_step)  # dropout
    g = torch.Generator().manual_seed(cfg.seed + cfg.start_step)  # batch sampling
    if optimizer is None:
        fused = {"fused": True} if device.type == "cuda" else {}
        optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, **fused)
    # The schedule multiplies each group's base lr, kept as "initial_lr" (torch's convention) so it survives
    # an optimizer state_dict round trip: after loading, group["lr"] holds the last scheduled value.
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    if scaler is None:
        scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")
    return _Run(device, T, g, optimizer, scaler, [group["initial_lr"] for group in optimizer.param_groups],
                [p for group in optimizer.param_groups for p in group["params"]])


def step(model: torch.nn.Module, data: Corpus, cfg: TrainConfig, run: _Run, t: int, batch_fn=None,
         callback: Callable[[StepInfo], None] | None = None) -> tuple[StepInfo, bool]:
    """One optimizer step, t counted from 0, in the order every lesson teaches: the schedule sets the lr; forward
    under autocast, loss ÷ G, backward (scaled for fp16) for each of the G micro-batches; unscale; clip (or measure)
    the global gradient norm; the scaler's step (skipped on inf/nan) and update; the callback; zero_grad. Returns
    what the callback saw, and whether the scaler skipped the step."""
    mult = cfg.lr_schedule(t)
    if not 0 <= mult < math.inf:
        raise ValueError(f"TrainConfig.lr_schedule returned {mult!r} at step {t}: it must be a finite multiplier >= 0")
    optimizer, scaler = run.optimizer, run.scaler
    for group, base in zip(optimizer.param_groups, run.base_lrs):
        group["lr"] = base * mult
    loss_sum = 0.0
    for micro in range(cfg.accum_steps):
        X, Y = batch_fn(t, micro) if batch_fn else data.batch("train", cfg.batch_size, run.T, run.g, run.device)
        with autocast(run.device, cfg.precision):
            _, loss = model(X, Y)
        if cfg.accum_normalize:
            loss = loss / cfg.accum_steps  # each micro-batch is 1/G of the batch: the mean over all tokens
        scaler.scale(loss).backward()
        loss_sum += loss.item() if cfg.accum_normalize else loss.item() / cfg.accum_steps
    scaler.unscale_(optimizer)  # grads back to true scale before measuring and clipping (no-op if disabled)
    if cfg.grad_clip is not None and run.clip is not None:  # a clipping written by hand (lesson 03's)
        grad_norm = torch.as_tensor(run.clip([p.grad for p in run.params if p.grad is not None], cfg.grad_clip))
    elif cfg.grad_clip is not None:
        grad_norm = torch.nn.utils.clip_grad_norm_(run.params, cfg.grad_clip)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in run.params if p.grad is not None])
    scale_before = scaler.get_scale() if scaler.is_enabled() else 1.0
    scaler.step(optimizer)  # skips the step if any gradient is inf/nan
    scaler.update()
    scale_after = scaler.get_scale() if scaler.is_enabled() else 1.0
    info = StepInfo(t, model, optimizer, loss_sum, grad_norm.item(), optimizer.param_groups[0]["lr"], scale_before)
    if callback is not None:
        callback(info)
    optimizer.zero_grad(set_to_none=True)
    # A scaler skips exactly the steps whose unscaled gradients hold an inf/nan, i.e. a non-finite norm
    # (a static scale never backs off, so a falling scale alone would miss them).
    skipped = scaler.is_enabled() and (scale_after < scale_before or not math.isfinite(info.grad_norm))
    return info, skipped


def train(model: torch.nn.Module, data: Corpus, cfg: TrainConfig, *,
          optimizer: torch.optim.Optimizer | None = None,
          scaler=None,
          batch_fn: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]] | None = None,
          callback: Callable[[StepInfo], None] | None = None,
          clip_fn: Callable[[list[torch.Tensor], float], object] | None = None) -> History:
    """Train `model` on `data` for cfg.steps optimizer steps and return its History.

    optimizer: default AdamW(param_groups(model, cfg.weight_decay), cfg.lr, cfg.betas); a given
        optimizer keeps its own group lrs (its "initial_lr") as the base that cfg.lr_schedule multiplies.
    scaler: default GradScaler for fp16 (disabled otherwise); any object with GradScaler's
        scale/unscale_/step/update/get_scale methods may be passed.
    batch_fn(step, micro) -> (X, Y) replaces sampling from `data` (e.g. to inject a bad batch).
    callback(StepInfo) runs after each optimizer step, before zero_grad.
    clip_fn(grads, max_norm) -> norm before clipping: scales the gradients in place, in place of
        torch.nn.utils.clip_grad_norm_ (where cfg.grad_clip is set).
    """
    run = _setup(model, data, cfg, optimizer, scaler, batch_fn)
    run.clip = clip_fn
    hist = History()

    def run_eval(t):
        hist.val_step.append(t)
        hist.val_loss.append(evaluate(model, data, "val", batches=cfg.eval_batches, batch_size=cfg.batch_size,
                                      block_size=run.T, precision=cfg.precision))

    t_start = time.perf_counter()
    model.train()
    end = cfg.start_step + cfg.steps
    first = cfg.start_step
    if cfg.checkpoint_dir is not None:
        Path(cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        path = checkpoint.latest(cfg.checkpoint_dir)
        if path is not None:
            first, saved = resume(path, model, run.optimizer, run.scaler, run.g, cfg.seed, cfg.start_step,
                                  cfg.start_step + cfg.steps)
            for f in dataclasses.fields(History):
                setattr(hist, f.name, getattr(History(**saved), f.name))
    if first == cfg.start_step:
        run_eval(cfg.start_step)
    stop = end if cfg.stop_at is None else cfg.stop_at
    bar = progress(total=stop - first, desc=cfg.desc, disable=not cfg.progress)
    for t in range(first, stop):
        check_cancelled()  # a panel's Cancel: stop between steps
        t0 = time.perf_counter()
        info, skipped = step(model, data, cfg, run, t, batch_fn, callback)
        if run.device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        hist.record(info, skipped, cfg.batch_size * run.T * cfg.accum_steps / dt)
        if (t + 1 - cfg.start_step) % cfg.eval_every == 0 or t + 1 == end:
            run_eval(t + 1)
        if cfg.checkpoint_dir is not None and ((cfg.checkpoint_every and (t + 1 - cfg.start_step)
                                                % cfg.checkpoint_every == 0) or t + 1 == end):
            hist.seconds += time.perf_counter() - t_start
            t_start = time.perf_counter()
            save(cfg.checkpoint_dir, t + 1, model, run.optimizer, run.scaler, run.g, dataclasses.asdict(hist),
                 seed=cfg.seed, start_step=cfg.start_step, steps=cfg.steps, keep=cfg.keep_checkpoints)
        bar.update(1)
        if t % 10 == 0 or t + 1 == end:
            bar.set_postfix(loss=f"{info.loss:.3f}", val=f"{hist.val_loss[-1]:.3f}", refresh=False)
    bar.close()
    hist.seconds += time.perf_counter() - t_start
    return hist


def branches(at: int, trunk: Callable[[dict], object], *runs: Callable[[dict], History]) -> list[History]:
    """Runs that are the same until step `at`, trained that far once. trunk(kw) trains to `at` and stops; then each
    of `runs`, in order, continues from its own copy of that checkpoint. kw holds checkpoint_dir and checkpoint_every
    (and for the trunk stop_at), for TrainConfig. Each run continues bit for bit as one from scratch would, as long as
    what makes it differ (a gradient hook, an injected batch) starts at `at` or later."""
    if not runs:
        raise ValueError("branches needs at least one run to continue from the trunk")
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(tmp) / f"branch_{i}" for i in range(len(runs))]
        trunk(dict(checkpoint_dir=str(dirs[0]), checkpoint_every=at, stop_at=at))
        for d in dirs[1:]:  # every copy before the first branch goes on saving into its own directory
            shutil.copytree(dirs[0], d)
        return [run(dict(checkpoint_dir=str(d), checkpoint_every=at)) for run, d in zip(runs, dirs)]
