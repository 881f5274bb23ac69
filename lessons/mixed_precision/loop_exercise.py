"""Lesson 04, your turn at the end: the whole training loop of lessons 00-04 (schedule, accumulation, clipping,
mixed precision with a loss scaler), written by the learner and checked step by step against the lab's
labtools.train.train on the same model, optimizer and batches."""

import inspect
import math
import time
from dataclasses import dataclass

import torch

from labtools import data
from labtools.exercises import Outcome, attempt, failed
from labtools.learner import bound_for, is_stub
from labtools.model import GPT, GPTConfig
from labtools.schedules import bind, constant, warmup_cosine
from labtools.train import TrainConfig, train

TOL = 1e-5  # relative: the same operations in the same order agree to float rounding


@dataclass(frozen=True)
class Loop:
    """What your loop is handed besides the model, its optimizer and the batches."""
    steps: int                 # optimizer steps
    accum_steps: int           # G, micro-batches per step
    schedule: object           # schedule(step) -> the factor of each group's initial learning rate, step from 0
    max_norm: float            # clip the global gradient norm at this
    precision: str             # "fp32" | "bf16" | "fp16": the forward under autocast in that type
    init_scale: float = 2.0**16    # fp16's loss scale at the start (lesson 04); unused otherwise
    growth_interval: int = 2000    # fp16: double the scale after this many steps without inf/nan


@dataclass(frozen=True)
class LoopCase:
    """One run to make twice, yours and the lab's, from the same initial weights and batches."""
    name: str
    optimizer: str         # "AdamW" or "SGD" (SGD shows a gradient that is G times too large; Adam hides it)
    accum_steps: int
    max_norm: float        # 1e9: never clips
    precision: str
    warmup: int = 0        # a linear warm-up over this many steps, then cosine to 10% of the peak (0: constant)
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    hint: str = ""         # the misconception this case shows, named first
    steps: int = 4


CASES = [
    LoopCase("one micro-batch, fp32", "AdamW", 1, 1e9, "fp32",
             hint="a step sets the learning rate, runs forward and backward, steps the optimizer and zeroes the "
                  "gradients, which otherwise add up into the next step's"),
    LoopCase("four micro-batches, SGD", "SGD", 4, 1e9, "fp32",
             hint="each micro-batch is a quarter of the batch: its loss is divided by G before backward, the "
                  "gradients are zeroed once per step, and the step's loss is the mean of the four"),
    LoopCase("clipping at 0.05", "SGD", 2, 0.05, "fp32",
             hint="clipping happens once per step, after the last micro-batch, by the norm of all gradients "
                  "together (lesson 03), not tensor by tensor"),
    LoopCase("a warm-up, then cosine", "AdamW", 1, 1.0, "fp32", warmup=3, steps=6,
             hint="the schedule multiplies each group's initial learning rate, with steps counted from 0; "
                  "multiplying the current rate compounds the factors"),
    LoopCase("bf16 autocast", "AdamW", 2, 1.0, "bf16",
             hint="the forward (model and loss) runs under torch.autocast with dtype=torch.bfloat16; the backward "
                  "and the step stay outside it"),
    # This model's first fp16 backward overflows at a scale of 2^19, not at 2^18: the scale must move for the run to
    # match (grown into an overflow, backed off out of one)
    LoopCase("fp16, the scale grows", "SGD", 2, 0.5, "fp16", init_scale=2.0**17, growth_interval=1, steps=6,
             hint="the loss is multiplied by the scale before backward and the gradients divided by it before "
                  "clipping; after growth_interval steps without inf/nan the scale doubles, and a step with one is "
                  "skipped and halves it"),
    LoopCase("fp16, the scale overflows", "SGD", 1, 1.0, "fp16", init_scale=2.0**21, steps=6,
             hint="a step whose gradients hold an inf or nan is skipped (no optimizer step) and the scale "
                  "halves; counting clean steps starts again"),
    LoopCase("fp16, grown into an overflow and counted again", "SGD", 1, 1.0, "fp16", init_scale=2.0**18,
             growth_interval=2, steps=8,
             hint="after an overflow the count of clean steps starts again from zero: growth waits for "
                  "growth_interval clean steps in a row, not for that many clean steps in all"),
]


def corpus() -> data.Corpus:
    return data.synthetic(vocab_size=16, order=2, branching=4, n_tokens=2**14, row_len=256, seed=0)


def setup(case: LoopCase, text: data.Corpus):
    """The model (seeded), its optimizer, a fixed batch stream get_batch(step, micro), and what the loop is handed."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=text.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=32))
    if case.optimizer == "AdamW":
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    stream = [[text.batch("train", 4, 16, g) for _ in range(case.accum_steps)] for _ in range(case.steps)]
    schedule = bind(warmup_cosine, warmup=case.warmup, total=case.steps, min_ratio=0.1) if case.warmup else \
        constant
    loop = Loop(case.steps, case.accum_steps, schedule, case.max_norm, case.precision, case.init_scale,
                case.growth_interval)
    return model, optimizer, (lambda step, micro: stream[step][micro]), loop


def lab_run(case: LoopCase, text: data.Corpus) -> tuple[list[float], list[torch.Tensor]]:
    """labtools.train.train on the case (torch's GradScaler for fp16): each step's loss, the weights after."""
    model, optimizer, get_batch, loop = setup(case, text)
    cfg = TrainConfig(steps=loop.steps, batch_size=4, block_size=16, accum_steps=loop.accum_steps,
                      lr_schedule=loop.schedule, grad_clip=loop.max_norm, precision=loop.precision,
                      eval_every=10**6, eval_batches=1, progress=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=loop.init_scale, growth_interval=loop.growth_interval,
                                  enabled=loop.precision == "fp16")
    h = train(model, text, cfg, optimizer=optimizer, scaler=scaler, batch_fn=get_batch)
    return h.loss, [p.detach().clone() for p in model.parameters()]


def your_run(fn, case: LoopCase, text: data.Corpus) -> tuple[list[float], list[torch.Tensor]]:
    model, optimizer, get_batch, loop = setup(case, text)
    losses = fn(model, optimizer, get_batch, loop)
    return losses, [p.detach().clone() for p in model.parameters()]


def _first_difference(mine, lab) -> tuple[str, float]:
    """Where your run first differs from the lab's, in words, and by how much (relative)."""
    losses, weights = mine
    lab_losses, lab_weights = lab
    if not isinstance(losses, (list, tuple)) or len(losses) != len(lab_losses):
        got = f"{len(losses)} values" if isinstance(losses, (list, tuple)) else type(losses).__name__
        return f"return the list of each step's loss ({len(lab_losses)} numbers), got {got}", math.inf
    for step, (a, b) in enumerate(zip(losses, lab_losses)):
        a = float(a)
        gap = abs(a - b) / max(1.0, abs(b)) if math.isfinite(a) else math.inf
        if not gap <= TOL:
            return f"step {step}'s loss is {a:.6f}, the lab's {b:.6f} (nats)", gap
    gap = max(((w - v).abs().max() / max(1.0, v.abs().max())).item() for w, v in zip(weights, lab_weights))
    if not gap <= TOL:
        return "the losses agree, but the weights after the last step differ", gap
    return "", gap


def check_loop(fn) -> Outcome:
    """Your loop against labtools.train.train (with torch's GradScaler) on eight runs, each adding one piece: the
    losses of every step and the weights after the last, to a relative 1e-5."""
    if is_stub(fn):
        return Outcome("not written", "not written yet: the lesson goes on with the lab's loop")
    text, worst = corpus(), 0.0
    for case in CASES:
        start = time.perf_counter()
        lab = lab_run(case, text)
        tried = attempt(your_run, fn, case, text, case=case.name, hint=case.hint, whose=fn,
                        seconds=bound_for(time.perf_counter() - start))
        if not tried.returned:
            return tried.outcome
        where, gap = _first_difference(tried.value, lab)
        if where:
            return failed(case.name, f"{where} (largest relative difference {gap:.1e}, allowed {TOL:.0e})",
                          case.hint)
        worst = max(worst, gap)
    return Outcome("pass", f"your training loop gives the lab's losses and weights on all {len(CASES)} runs "
                           f"(largest relative difference {worst:.1e})", worst)


def reference(model, optimizer, get_batch, loop):
    """Train for loop.steps optimizer steps; return each step's loss (the mean over its micro-batches)."""
    device = next(model.parameters()).device
    params = [p for group in optimizer.param_groups for p in group["params"]]
    initial = [group["lr"] for group in optimizer.param_groups]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(loop.precision)
    scale = loop.init_scale if loop.precision == "fp16" else 1.0  # the loss scale (1: none)
    clean = 0                                                      # steps since the scale last changed
    losses = []
    for step in range(loop.steps):
        for group, lr in zip(optimizer.param_groups, initial):
            group["lr"] = lr * loop.schedule(step)        # the schedule scales the initial lr
        total = 0.0
        for micro in range(loop.accum_steps):
            X, Y = get_batch(step, micro)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                _, loss = model(X, Y)
            loss = loss / loop.accum_steps                # each micro-batch is 1/G of the batch
            (loss * scale).backward()                     # gradients add up across micro-batches
            total += loss.item()
        grads = [p.grad for p in params if p.grad is not None]
        for g in grads:
            g.mul_(1.0 / scale)                           # true-scale gradients before anything reads them
        finite = all(torch.isfinite(g).all() for g in grads)
        if finite:
            torch.nn.utils.clip_grad_norm_(params, loop.max_norm)  # one norm over all of them
            optimizer.step()
        if loop.precision == "fp16":                      # a dynamic scale: halve on overflow, grow when calm
            clean = clean + 1 if finite else 0
            if not finite:
                scale /= 2
            elif clean == loop.growth_interval:
                scale, clean = scale * 2, 0
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    return losses


def solution_source() -> str:
    """The reference as the learner's cell would hold it."""
    return inspect.getsource(reference).replace("def reference(", "def my_training_loop(")
