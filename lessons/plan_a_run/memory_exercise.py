"""Lesson 16, your turn: the bytes of model states (weights, gradients, master weights, Adam's moments) one GPU
holds under a layout and a ZeRO stage, checked against the planner's memory_per_gpu."""

import html
import inspect

from IPython.display import HTML, display

from labtools.exercises import NOT_WRITTEN, Outcome, is_stub, outcome, where_it_failed
from labtools.plan import MODELS, Layout, memory_per_gpu

HINT = ("16 bytes per parameter in bf16 mixed precision: weights 2 and gradients 2 (bf16), master weights 4 and "
        "Adam's two moments 8 (fp32); tensor and pipeline parallelism split them all (÷ tp·pp); ZeRO then shards "
        "over the ranks that hold the same weights")


def reference(n_params, layout, zero_stage):
    """Bytes of model states per GPU: bf16 mixed-precision AdamW, `layout` a labtools.plan.Layout (dp, tp, pp, cp)."""
    per_gpu = n_params / (layout.tp * layout.pp)   # tensor and pipeline parallelism split every state
    replicas = layout.dp * layout.cp               # ranks holding the same weights: ZeRO shards over them
    weights, grads, master_and_adam = 2 * per_gpu, 2 * per_gpu, 12 * per_gpu
    master_and_adam /= replicas if zero_stage >= 1 else 1
    grads /= replicas if zero_stage >= 2 else 1
    weights /= replicas if zero_stage >= 3 else 1
    return weights + grads + master_and_adam


CASES = (  # (name, model, layout, ZeRO stage, hint)
    ("7B on 8 GPUs, plain data parallelism", "7B", Layout(8, 1, 1), 0, "with no sharding every GPU holds all "
     "16 bytes of every parameter"),
    ("70B, dp 512 × tp 4, ZeRO-1", "70B", Layout(512, 4, 1), 1, "tp splits every state by 4; ZeRO-1 then shards "
     "the master weights and Adam's moments (12 bytes) over the 512 data-parallel ranks"),
    ("GPT-3 175B, dp 8 × tp 8 × pp 16, ZeRO-2", "GPT-3 175B", Layout(8, 8, 16), 2, "ZeRO-2 shards the gradients "
     "too"),
    ("7B on 64 GPUs, ZeRO-3 (FSDP)", "7B", Layout(64, 1, 1), 3, "ZeRO-3 shards the weights as well: everything "
     "÷ dp"),
    ("405B, dp 8 × tp 8 × pp 16 × cp 16, ZeRO-1", "405B", Layout(8, 8, 16, 16), 1, "context-parallel ranks hold "
     "the same weights as data-parallel ones: ZeRO shards over dp · cp = 128 ranks, not 8"),
)


def expected(model: str, layout: Layout, zero: int) -> float:
    return memory_per_gpu(MODELS[model], layout, zero_stage=zero).model_states


def check_model_states(fn) -> Outcome:
    """Your function against labtools.plan.memory_per_gpu(...).model_states on five layouts."""
    if is_stub(fn):
        return Outcome("not written", NOT_WRITTEN)
    results = []
    for name, model, layout, zero, hint in CASES:
        want = expected(model, layout, zero)
        try:
            got = fn(MODELS[model].n_params, layout, zero)
        except NotImplementedError:
            return Outcome("not written", NOT_WRITTEN)
        except Exception as e:  # noqa: BLE001 - the learner's error becomes a message, not a traceback
            return outcome([{"case": name, "error": where_it_failed(e, fn.__code__.co_filename), "hint": HINT}],
                           tol=0.0, what="", reference="")
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return outcome([{"case": name, "error": f"return a number of bytes, got {type(got).__name__}"}], tol=0.0,
                           what="", reference="")
        off = abs(got / want - 1)
        results.append({"case": name, "difference": off,
                        "hint": f"{hint} (you said {got / 1e9:,.2f} GB, the planner {want / 1e9:,.2f} GB)"})
    return outcome(results, tol=1e-9, what="your model states per GPU", reference="the planner's memory_per_gpu",
                   relative=True)


def solution_source() -> str:
    return inspect.getsource(reference).replace("def reference(", "def my_model_states(")


def show_solution() -> None:
    """The reference solution, folded (open it once you have tried)."""
    display(HTML(f"<details><summary>A solution</summary><pre>{html.escape(solution_source())}</pre></details>"))
