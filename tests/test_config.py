"""labtools.config: profiles, the shared config and its ranges, configs derived for ranks; and Findings."""

from dataclasses import dataclass

import pytest
import torch

from labtools.claims import Findings
from labtools.config import LabConfig, derive, resolve_profile
from labtools.device import pick_device, report
from labtools.validate import check_range
from lessons import training_loop


def test_unknown_profile_names_the_parameter_and_choices():
    with pytest.raises(ValueError, match=r"PROFILE must be one of \('smoke', 'cpu', 'gpu', 'auto'\)"):
        training_loop.settings("fast")


def test_auto_profile_follows_cuda():
    assert resolve_profile("auto") == ("gpu" if torch.cuda.is_available() else "cpu")


def test_overrides_apply_and_none_keeps_the_profile_value():
    s = training_loop.settings("smoke", steps=123, lr=None)
    assert s.steps == 123 and s.lr == training_loop.PROFILES["smoke"].lr and s.profile == "smoke"


@pytest.mark.parametrize("kw, name", [
    (dict(steps=0), "STEPS"), (dict(lr=5.0), "LR"), (dict(n_layer=100), "N_LAYER"),
    (dict(n_embd=66), "N_EMBD"), (dict(steps=1.5), "STEPS"),
])
def test_out_of_range_parameters_name_themselves(kw, name):
    with pytest.raises(ValueError, match=name):
        training_loop.settings("smoke", **kw)


def test_unknown_override_is_rejected():
    with pytest.raises(ValueError, match="unknown parameter"):
        training_loop.settings("smoke", stepz=3)


def test_check_helpers():
    check_range("X", 3, 1, 5)
    with pytest.raises(ValueError, match=r"X must be a number in \[1, 5\], got 6"):
        check_range("X", 6, 1, 5)
    with pytest.raises(ValueError, match="X"):
        check_range("X", True, 0, 5)


def test_device_helpers():
    assert pick_device().type in ("cuda", "mps", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            pick_device("cuda")
    info = report("cpu")
    assert info["torch"] == torch.__version__ and info["cpu_threads"] >= 1 and isinstance(info["bf16"], bool)




def test_a_rank_config_derived_from_settings_takes_the_shared_fields_and_the_changes():
    from lessons.compute_budget.ranks import ScalingJob
    S = training_loop.settings("smoke", seed=7)
    job = derive(ScalingJob, S, steps=3)
    assert (job.n_layer, job.n_embd, job.block_size, job.seed, job.lr) == (S.n_layer, S.n_embd, S.block_size, 7, S.lr)
    assert job.steps == 3 and job.rounds == ScalingJob().rounds
    with pytest.raises(ValueError, match="STEPS"):  # validated by the derived class
        derive(ScalingJob, S, steps=0)


def test_a_lesson_range_is_checked_by_the_shared_config_and_names_its_parameter():
    @dataclass(frozen=True, kw_only=True)
    class Toy(LabConfig):
        accum_k: int = 4
        warmup: float = 0.1
        RANGES = {"ACCUM_K": (2, 64), "WARMUP": (0.0, 1.0)}

    assert Toy(accum_k=2, warmup=1).accum_k == 2  # an int is a valid float
    for kw, name in ((dict(accum_k=65), "ACCUM_K"), (dict(accum_k=4.0), "ACCUM_K"), (dict(warmup=1.5), "WARMUP")):
        with pytest.raises(ValueError, match=name):
            Toy(**kw)


def test_findings_are_bullets_a_notebook_can_display_as_markdown():
    f = Findings(["**3×** the all-reduces", "", None, "the same gradients "])
    assert f.statements == ("**3×** the all-reduces", "the same gradients")
    assert str(f) == f._repr_markdown_() == "- **3×** the all-reduces\n\n- the same gradients"
    folded = Findings(["the answer"], ["a number: **4**", "| a | b |\n|---|---|\n| 1 | 2 |"], summary="Numbers")
    assert folded.statements == ("the answer",) and len(folded.details) == 2
    assert str(folded) == ("- the answer\n\n<details><summary>Numbers</summary>\n\n- a number: **4**\n\n"
                           "| a | b |\n|---|---|\n| 1 | 2 |\n\n</details>")


def test_the_run_setup_folds_every_setting_and_the_machine_under_one_line():
    from labtools.device import run_setup
    from lessons import training_loop

    S = training_loop.settings("smoke", steps=123)
    box = run_setup(S)._repr_html_()
    assert box.startswith("<details><summary>This run: the <code>smoke</code> profile")
    assert "<td><code>steps</code></td><td>123</td>" in box and "<td><code>torch</code></td>" in box
