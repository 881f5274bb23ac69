import pytest
import torch

from labtools.device import pick_device, report, seed_everything
from labtools.profiles import check_choice, check_range, resolve_profile
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
    with pytest.raises(ValueError, match="MODE must be one of"):
        check_choice("MODE", "c", ("a", "b"))


def test_device_helpers():
    assert pick_device().type in ("cuda", "mps", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            pick_device("cuda")
    seed_everything(3)
    a = torch.rand(3)
    seed_everything(3)
    assert torch.equal(a, torch.rand(3))
    info = report("cpu")
    assert info["torch"] == torch.__version__ and info["cpu_threads"] >= 1 and isinstance(info["bf16"], bool)


def test_as_config_is_plain_json_without_the_profile():
    import json
    from lessons import data_parallel
    from labtools.profiles import as_config
    cfg = as_config(data_parallel.settings("smoke"), "world_sizes", accum_k=8)
    assert "profile" not in cfg and "world_sizes" not in cfg and cfg["accum_k"] == 8
    assert json.loads(json.dumps(cfg)) == cfg
