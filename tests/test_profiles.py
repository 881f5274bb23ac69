import pytest
import torch

from labtools.device import pick_device, report
from labtools.profiles import check_range, resolve_profile
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
    with pytest.raises(ValueError, match=r"X must be in \[1, 5\], got 6"):
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


