"""Lesson 16, your turn: the bytes of model states (weights, gradients, master weights, Adam's moments) one GPU
holds under a layout and a ZeRO stage, checked against the planner's memory_per_gpu."""

import inspect


from labtools.exercises import Case, Outcome, check
from labtools.layout import Layout, memory_per_gpu
from labtools.shapes import MODELS


def reference(n_params, layout, zero_stage):
    """Bytes of model states per GPU under bf16 mixed-precision AdamW; `layout` has .dp, .tp, .pp and .cp."""
    per_gpu = n_params / (layout.tp * layout.pp)   # tensor and pipeline parallelism split every state
    replicas = layout.dp * layout.cp               # ranks holding the same weights: ZeRO shards over them
    weights, grads, master_and_adam = 2 * per_gpu, 2 * per_gpu, 12 * per_gpu
    master_and_adam /= replicas if zero_stage >= 1 else 1
    grads /= replicas if zero_stage >= 2 else 1
    weights /= replicas if zero_stage >= 3 else 1
    return weights + grads + master_and_adam


def planner_states(n_params, layout, zero_stage):
    """What the check compares with: labtools.plan.memory_per_gpu's model states for the published model of that
    size (its activations left aside)."""
    model = next(m for m in MODELS.values() if m.n_params == n_params)
    return memory_per_gpu(model, layout, zero_stage=zero_stage).model_states


CASES = (  # (name, model, layout, ZeRO stage, hint)
    ("7B on 8 GPUs, plain data parallelism", "7B", Layout(8, 1, 1), 0, "with no sharding every GPU holds all "
     "16 bytes of every parameter"),
    ("70B, dp 512 × tp 4, ZeRO-1", "70B", Layout(512, 4, 1), 1, "tp splits every state by 4; ZeRO-1 then shards "
     "the master weights and Adam's moments (12 bytes) over the 512 data-parallel ranks"),
    ("70B, tp 8 × pp 4, no ZeRO", "70B", Layout(1, 8, 4), 0, "pipeline parallelism gives each GPU a pp-th of the "
     "layers, and with them of every state: divide by tp · pp"),
    ("GPT-3 175B, dp 8 × tp 8 × pp 16, ZeRO-2", "GPT-3 175B", Layout(8, 8, 16), 2, "ZeRO-2 shards the gradients "
     "too"),
    ("7B on 64 GPUs, ZeRO-3 (FSDP)", "7B", Layout(64, 1, 1), 3, "ZeRO-3 shards the weights as well: everything "
     "÷ dp"),
    ("405B, dp 8 × tp 8 × pp 16 × cp 16, ZeRO-1", "405B", Layout(8, 8, 16, 16), 1, "context-parallel ranks hold "
     "the same weights as data-parallel ones: ZeRO shards over dp · cp = 128 ranks, not 8"),
)


def check_model_states(fn) -> Outcome:
    """Your function against labtools.plan.memory_per_gpu(...).model_states on six layouts (bytes, relative)."""
    cases = [Case(name, (MODELS[model].n_params, layout, zero), hint) for name, model, layout, zero, hint in CASES]
    return check(fn, planner_states, cases, tol=1e-9, relative=True, what="your model states per GPU", unit="bytes",
                 against="the planner's memory per GPU")


def solution_source() -> str:
    return inspect.getsource(reference).replace("def reference(", "def my_model_states(")
