"""Every parameter at both edges of its documented range: the settings accept it, and every panel built from
those settings starts at the notebook's own values (ipywidgets would otherwise clamp them silently, or fail
when a slider's minimum exceeds its maximum). The ranges are read from each lesson's RANGES and check_range calls."""

import ast
import inspect
from pathlib import Path

import math

import pytest
import torch

import labtools.config
from labtools import budget, moe, plan
from labtools import profiling as measure
from labtools.exercises import Case, check
from labtools.layout import layouts
from labtools.parallel.context import SeqLayout, positions
from labtools.shapes import MODELS, ModelShape
from lessons import (activation_checkpointing, adamw_vs_adam_l2, compute_budget, context_parallel, data_parallel,
                     evidence, fault_tolerance, finetune, fsdp_zero, inside_kernels, lr_schedules, memory_budget,
                     mixed_precision, mixture_of_experts, muon_mup, pipeline_parallel, plan_a_run, profiling,
                     rl_verifier, stability, tensor_parallel, tokens, training_loop)
from lessons.activation_checkpointing import playground as checkpointing_playground
from lessons.adamw_vs_adam_l2 import landscape
from lessons.data_parallel import playground as ddp_playground
from lessons.mixture_of_experts import training as moe_training
from lessons.pipeline_parallel import playground as pipeline_playground
from lessons.pipeline_parallel import schedule
from lessons.training_loop import playground as size_playground

LESSONS = (training_loop, adamw_vs_adam_l2, lr_schedules, stability, mixed_precision, activation_checkpointing,
           memory_budget, data_parallel, fsdp_zero, pipeline_parallel, tensor_parallel, fault_tolerance, compute_budget,
           profiling, context_parallel, mixture_of_experts, plan_a_run, tokens, evidence, muon_mup, finetune,
           rl_verifier, inside_kernels)


OPEN = "open:"  # an expression so marked is a bound the range excludes (check_range's open_lo / open_hi)


def _checks(source: str, cls: str) -> list[tuple[str, str, str, str]]:
    """(PARAMETER, field, low expression, high expression) of a config class: its RANGES and the check_range calls
    of its __post_init__."""
    tree = ast.parse(source)
    settings = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    out = []
    for node in settings.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "RANGES":
            for key, bounds in zip(node.value.keys, node.value.values):
                out.append((key.value, key.value.lower(), ast.unparse(bounds.elts[0]), ast.unparse(bounds.elts[1])))
    post = [n for n in settings.body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__"]
    for call in (c for p in post for c in ast.walk(p)):
        if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "check_range" and call.args[1:2] \
                and isinstance(call.args[1], ast.Attribute):
            name, field, lo, hi = call.args[:4]
            opened = {k.arg for k in call.keywords if isinstance(k.value, ast.Constant) and k.value.value is True}
            out.append((name.value, field.attr, OPEN * ("open_lo" in opened) + ast.unparse(lo),
                        OPEN * ("open_hi" in opened) + ast.unparse(hi)))
    return out


# The shared config's SEED range holds for every lesson (its other ranges are narrowed by the lessons that use them)
BASE = [c for c in _checks(inspect.getsource(labtools.config), "LabConfig") if c[0] == "SEED"]


def ranges(module) -> list[tuple[str, str, str, str]]:
    """(PARAMETER, field, low expression, high expression) of every check_range in Settings.__post_init__, and
    the shared config's SEED."""
    own = _checks(Path(inspect.getsourcefile(module)).read_text(), "Settings")
    return own + [c for c in BASE if c[0] not in {o[0] for o in own}]


EDGES = [pytest.param(m, name, field, expr, id=f"{m.__name__.split('.')[-1]}-{name}-{side}")
         for m in LESSONS for name, field, lo, hi in ranges(m) for side, expr in (("low", lo), ("high", hi))]


def test_every_lesson_declares_ranges():
    assert BASE and all(ranges(m) for m in LESSONS)


def panels(module, S) -> list[tuple[object, dict[str, object]]]:
    """The lesson's panels built from S, each with the values its controls must start at."""
    if module is training_loop:
        panel, _ = size_playground.size_panel(S, corpus=None, baseline=None)
        return [(panel, {"n_layer": S.n_layer, "n_embd": S.n_embd, "steps": S.steps})]
    if module is activation_checkpointing:
        return [(checkpointing_playground.memory_panel(S), {"seq_len": S.seq_len, "batch_size": S.batch_size})]
    if module is data_parallel:
        panel, _ = ddp_playground.ddp_panel(S)
        return [(panel, {"accum_k": S.accum_k, "world": min(S.world_sizes)})]
    if module is pipeline_parallel:
        panel, _ = pipeline_playground.measured_panel(S, results={})
        return [(schedule.panel(S), {"m": S.m, "v": S.v, "p": max(S.worlds)}),
                (panel, {"p": max(S.worlds)})]
    if module is mixture_of_experts:
        logits = [torch.zeros(16, S.n_experts)]
        panel = moe_training.routing_panel({"MoE": {"logits": logits}, "no balance": {"logits": logits}}, S)
        return [(panel, {"factor": S.capacity_factor, "k": S.top_k})]
    if module is adamw_vs_adam_l2:
        panel = landscape.cell_panel(S, runs={})
        return [(panel, {"lr": S.grid_lrs[len(S.grid_lrs) // 2], "wd": S.grid_wds[-1]})]
    return []


def edge(module, name: str, expr: str, base) -> tuple[object, object]:
    """(the edge value the range accepts, the nearest value it refuses): an open bound is refused itself, and a
    value a millionth inside it is accepted."""
    lo_side = any(expr == lo for n, f, lo, hi in ranges(module) if n == name)
    bound = eval(expr.removeprefix(OPEN), {**vars(module), "self": base})  # noqa: S307 - the lesson's own range
    if expr.startswith(OPEN):
        return bound + (1 if lo_side else -1) * 1e-6 * max(1.0, abs(bound)), bound
    outside = bound - (1 if lo_side else -1) if isinstance(bound, int) else bound * (0.5 if lo_side else 2)
    if lo_side and outside == bound:  # a float low edge of 0
        outside = -1.0
    return bound, outside


@pytest.mark.parametrize("module, name, field, expr", EDGES)
def test_edge_values_are_accepted_and_panels_start_there(module, name, field, expr):
    base = module.settings("smoke")
    value, _ = edge(module, name, expr, base)
    S = module.settings("smoke", **{field: value})
    assert getattr(S, field) == value
    for panel, expected in panels(module, S):
        got = {k: panel.controls[k].value for k in expected}
        assert got == expected, f"{name} = {value}: the panel starts at {got}, the notebook ran {expected}"


@pytest.mark.parametrize("module, name, field, expr", EDGES)
def test_just_outside_the_range_is_a_named_error(module, name, field, expr):
    _, outside = edge(module, name, expr, module.settings("smoke"))
    with pytest.raises(ValueError, match=name):
        module.settings("smoke", **{field: outside})


@pytest.mark.parametrize("module", LESSONS, ids=lambda m: m.__name__.split(".")[-1])
def test_an_unknown_profile_is_a_named_error(module):
    with pytest.raises(ValueError, match=r"PROFILE must be one of \('smoke', 'cpu', 'gpu', 'auto'\)"):
        module.settings("turbo")


SHAPE = MODELS["7B"]
CPU = torch.device("cpu")
BAD_ARGUMENTS = [  # (call, the argument the message must name)
    (lambda: moe.capacity(-5, 4, 2, 1.25), "tokens"),
    (lambda: moe.capacity(8, 0, 1, 1.25), "n_experts"),
    (lambda: moe.capacity(8, 4, 5, 1.25), "k"),
    (lambda: moe.capacity(8, 4, 2, 0.0), "factor"),
    (lambda: moe.capacity(8, 4, 2, math.nan), "factor"),
    (lambda: moe.capacity(8, 4, 2, math.inf), "factor"),
    (lambda: moe.route(torch.zeros(8, 4), 2, 2.5), "capacity"),
    (lambda: moe.route(torch.zeros(8, 4), 0, 2), "k"),
    (lambda: moe.route(torch.zeros(8), 1, 2), "logits"),
    (lambda: positions(12, 2, 5, SeqLayout.ZIGZAG), "r"),
    (lambda: positions(12, 2, -1, SeqLayout.CONTIGUOUS), "r"),
    (lambda: positions(12, 0, 0, SeqLayout.ZIGZAG), "c"),
    (lambda: positions(12, 2, 0, "diagonal"), "layout"),
    (lambda: plan.Cluster(8, 80e9, 0, 300e9, 25e9), "peak_flops"),
    (lambda: plan.Cluster(8, -1, 312e12, 300e9, 25e9), "gpu_memory"),
    (lambda: plan.Cluster(0, 80e9, 312e12, 300e9, 25e9), "gpus_per_node"),
    (lambda: plan.Cluster(8, 80e9, 312e12, 300e9, math.nan), "inter_bw"),
    (lambda: ModelShape(2, 64, 8, 100, 64, n_kv_head=3), "n_kv_head"),
    (lambda: ModelShape(2, 64, 5, 100, 64), "n_head"),
    (lambda: ModelShape(0, 64, 8, 100, 64), "n_layer"),
    (lambda: layouts(8, SHAPE, cp=(0,)), "cp"),
    (lambda: layouts(0, SHAPE), "world"),
    (lambda: budget.architecture(2, 64, 5, 100, 64, 1), "n_head"),
    (lambda: budget.architecture(2, 64, 4, 100, 64, 0), "micro_batch"),
    (lambda: measure.matmul_peak([8], CPU, repeats=0), "repeats"),
    (lambda: measure.bandwidth(1024, CPU, repeats=0), "repeats"),
    (lambda: check(lambda x: x, lambda x: x, []), "case"),
    (lambda: check(lambda x: x, lambda x: x, [Case("one", (1.0,))], tol=math.nan), "tol"),
]


@pytest.mark.parametrize("call, name", BAD_ARGUMENTS, ids=[f"{i}-{n}" for i, (_, n) in enumerate(BAD_ARGUMENTS)])
def test_a_bad_argument_to_the_library_is_refused_naming_it(call, name):
    with pytest.raises(ValueError, match=name):
        call()


@pytest.mark.parametrize("settings, name", [(lambda: profiling.settings("smoke", max_length=4096), "MAX_LENGTH"),
                                            (lambda: context_parallel.settings("smoke", seq=2048), "SEQ"),
                                            (lambda: plan_a_run.settings("smoke", batch_size=64), "BATCH_SIZE")],
                         ids=["13-MAX_LENGTH", "14-SEQ", "16-BATCH_SIZE"])
def test_a_setting_this_machine_cannot_hold_is_refused_with_the_numbers(settings, name, monkeypatch):
    import labtools.memory

    settings()  # fits here
    monkeypatch.setattr(labtools.memory, "free_bytes", lambda device: 10**6)  # a machine with 1 MB free
    with pytest.raises(ValueError, match=rf"{name} = \d+ would need about [\d.]+ GB .* 0.0 GB free"):
        settings()
