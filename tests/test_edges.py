"""Every parameter at both edges of its documented range: the settings accept it, and every panel built from
those settings starts at the notebook's own values (ipywidgets would otherwise clamp them silently, or fail
when a slider's minimum exceeds its maximum). The ranges are read from each lesson's RANGES and check_range calls."""

import ast
import inspect
from pathlib import Path

import pytest

import labtools.config
from lessons import (activation_checkpointing, adamw_vs_adam_l2, compute_budget, context_parallel, data_parallel,
                     fault_tolerance, fsdp_zero, lr_schedules, memory_budget, mixed_precision, mixture_of_experts,
                     pipeline_parallel, plan_a_run, profiling, stability, tensor_parallel, training_loop)
from lessons.activation_checkpointing import playground as checkpointing_playground
from lessons.adamw_vs_adam_l2 import landscape
from lessons.data_parallel import playground as ddp_playground
from lessons.pipeline_parallel import playground as pipeline_playground
from lessons.pipeline_parallel import schedule
from lessons.training_loop import playground as size_playground

LESSONS = (training_loop, adamw_vs_adam_l2, lr_schedules, stability, mixed_precision, activation_checkpointing,
           memory_budget, data_parallel, fsdp_zero, pipeline_parallel, tensor_parallel, fault_tolerance, compute_budget,
           profiling, context_parallel, mixture_of_experts, plan_a_run)


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
            out.append((name.value, field.attr, ast.unparse(lo), ast.unparse(hi)))
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
    if module is adamw_vs_adam_l2:
        panel = landscape.cell_panel(S, runs={})
        return [(panel, {"lr": S.grid_lrs[len(S.grid_lrs) // 2], "wd": S.grid_wds[-1]})]
    return []


@pytest.mark.parametrize("module, name, field, expr", EDGES)
def test_edge_values_are_accepted_and_panels_start_there(module, name, field, expr):
    base = module.settings("smoke")
    value = eval(expr, {"self": base})  # noqa: S307 - the lesson's own range expression
    S = module.settings("smoke", **{field: value})
    assert getattr(S, field) == value
    for panel, expected in panels(module, S):
        got = {k: panel.controls[k].value for k in expected}
        assert got == expected, f"{name} = {value}: the panel starts at {got}, the notebook ran {expected}"


@pytest.mark.parametrize("module, name, field, expr", EDGES)
def test_just_outside_the_range_is_a_named_error(module, name, field, expr):
    base = module.settings("smoke")
    value = eval(expr, {"self": base})  # noqa: S307
    lo_side = any(expr == lo for n, f, lo, hi in ranges(module) if n == name)
    outside = value - (1 if lo_side else -1) if isinstance(value, int) else value * (0.5 if lo_side else 2)
    if lo_side and outside == value:  # a float low edge of 0
        outside = -1.0
    with pytest.raises(ValueError, match=name):
        module.settings("smoke", **{field: outside})


@pytest.mark.parametrize("module", LESSONS, ids=lambda m: m.__name__.split(".")[-1])
def test_an_unknown_profile_is_a_named_error(module):
    with pytest.raises(ValueError, match=r"PROFILE must be one of \('smoke', 'cpu', 'gpu', 'auto'\)"):
        module.settings("turbo")
