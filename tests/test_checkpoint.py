"""labtools.checkpoint and resuming in labtools.train: atomic saves that survive SIGKILL at any moment, corrupted
files refused before unpickling, bitwise resume, clear errors. (The elastic multi-process resume: test_dist.py.)"""

import json
import pickle
import random
import warnings

import numpy as np
import pytest
import torch

from labtools import checkpoint, data
from labtools.checkpoint import CheckpointError, CheckpointWarning
from labtools.model import GPT, GPTConfig
from labtools.schedules import bind, warmup_cosine
from labtools.train import TrainConfig, train


def state(seed=0, n=100):
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(n, generator=g), "b": torch.zeros(3)}, "note": "x", "losses": [1.5, 2.5]}


def test_save_load_roundtrip_keeps_the_newest_k(tmp_path):
    for step in (5, 10, 15, 20):
        path = checkpoint.save(tmp_path, step, keep=2, **state(step))
    assert path.name == "step_00000020"
    assert [p.name for p in checkpoint.checkpoints(tmp_path)] == ["step_00000015", "step_00000020"]
    assert checkpoint.latest(tmp_path) == path
    loaded = checkpoint.load(path)
    assert loaded["step"] == 20 and loaded["note"] == "x" and loaded["losses"] == [1.5, 2.5]
    assert torch.equal(loaded["model"]["w"], state(20)["model"]["w"])
    assert checkpoint.verify(path)["files"][checkpoint.STATE]["bytes"] == (path / checkpoint.STATE).stat().st_size


def test_saving_a_step_again_replaces_it_whole(tmp_path):
    checkpoint.save(tmp_path, 3, **state(1))
    checkpoint.save(tmp_path, 3, **state(2))
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000003"]
    assert torch.equal(checkpoint.load(tmp_path / "step_00000003")["model"]["w"], state(2)["model"]["w"])


@pytest.mark.parametrize("how, reason", [("truncate", "truncated"), ("flip", "sha256")])
def test_a_damaged_file_is_refused_without_unpickling(tmp_path, monkeypatch, how, reason):
    from lessons.fault_tolerance.crashes import corrupt
    checkpoint.save(tmp_path, 1, **state(1))
    path = checkpoint.save(tmp_path, 2, **state(2))
    corrupt(path / checkpoint.STATE, how)
    unpickled = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: unpickled.append(a))
    with pytest.raises(CheckpointError, match=reason):
        checkpoint.load(path)
    with pytest.warns(CheckpointWarning, match=f"skipping step_00000002: .*{reason}"):
        assert checkpoint.latest(tmp_path).name == "step_00000001"
    assert unpickled == []


def test_missing_manifest_and_unfinished_saves_are_skipped_with_a_warning(tmp_path):
    checkpoint.save(tmp_path, 1, **state(1))
    (tmp_path / ".tmp-step_00000002-abc").mkdir()
    half = tmp_path / "step_00000003"
    half.mkdir()
    (half / checkpoint.STATE).write_bytes(b"\0" * 10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert checkpoint.latest(tmp_path).name == "step_00000001"
    messages = " | ".join(str(w.message) for w in caught)
    assert "unfinished save" in messages and "manifest.json: missing" in messages


def test_a_manifest_entry_without_its_sha256_is_skipped_with_a_warning(tmp_path):
    checkpoint.save(tmp_path, 1, **state(1))
    newer = checkpoint.save(tmp_path, 2, **state(2))
    manifest = json.loads((newer / checkpoint.MANIFEST).read_text())
    for meta in manifest["files"].values():
        del meta["sha256"]
    (newer / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    with pytest.warns(checkpoint.CheckpointWarning, match="lacks its bytes or sha256"):
        assert checkpoint.latest(tmp_path).name == "step_00000001"


def test_latest_of_an_empty_directory_is_none(tmp_path):
    assert checkpoint.latest(tmp_path) is None


@pytest.mark.parametrize("call, error, match", [
    (lambda d: checkpoint.latest(d / "nowhere"), FileNotFoundError, "does not exist"),
    (lambda d: checkpoint.save(d, 1, keep=0, model={}), ValueError, "keep"),
    (lambda d: checkpoint.save(d, -1, model={}), ValueError, "step"),
    (lambda d: checkpoint.save(d, 1), ValueError, "nothing to save"),
    (lambda d: checkpoint.load(d / "nowhere"), CheckpointError, "not a checkpoint"),
])
def test_bad_input_gives_clear_errors(tmp_path, call, error, match):
    with pytest.raises(error, match=match):
        call(tmp_path)


def test_a_file_where_the_directory_should_be(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(NotADirectoryError):
        checkpoint.save(tmp_path / "f", 1, model={})


def test_rng_state_roundtrip_through_a_checkpoint(tmp_path):
    g = torch.Generator().manual_seed(7)
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    checkpoint.save(tmp_path, 1, rng=checkpoint.rng_state(g))
    draws = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=g))
    torch.manual_seed(9), np.random.seed(9), random.seed(9), g.manual_seed(9)
    checkpoint.set_rng_state(checkpoint.load(tmp_path / "step_00000001")["rng"], g)
    again = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=g))
    assert torch.equal(draws[0], again[0]) and (draws[1] == again[1]).all() and draws[2] == again[2]
    assert torch.equal(draws[3], again[3])


# --- killed in the middle of a save (real SIGKILLs of a child process) ------------------------------------------------

def test_twenty_four_kills_at_random_moments_never_break_latest(tmp_path):
    from lessons.fault_tolerance.crashes import kill_saver, save_seconds
    numel = 2 * 2**20
    save_s = save_seconds(numel, tmp_path / "timing")
    rng = np.random.default_rng(0)
    mid_save = 0
    for i in range(24):
        left = kill_saver(tmp_path / "ckpt", numel, in_place=False, delay_s=float(rng.uniform(0, 3 * save_s)))
        assert left["exitcode"] == -9
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CheckpointWarning)
            path = checkpoint.latest(tmp_path / "ckpt")
        assert path is not None, f"kill {i}"
        assert checkpoint.load(path)["model"]["w"].numel() == numel, f"kill {i}"
        mid_save += left["unfinished"] > 0
        for leftover in (tmp_path / "ckpt").glob(".tmp-step_*"):
            leftover.rename(tmp_path / f"left{i}")  # so the next kill's count is its own
    assert mid_save >= 3, "too few kills landed in the middle of a save to test anything"


def test_the_in_place_save_killed_mid_write_is_lost_and_the_atomic_one_is_not(tmp_path):
    from lessons.fault_tolerance.crashes import kill_saver
    left = kill_saver(tmp_path / "in_place", 2**20, in_place=True, delay_s=None)
    assert left["bytes_on_disk"] < left["bytes_expected"]
    with pytest.raises(Exception):
        torch.load(tmp_path / "in_place" / "checkpoint.pt", weights_only=True)
    left = kill_saver(tmp_path / "atomic", 2**20, in_place=False, delay_s=None)
    assert left["unfinished"] >= 1
    with pytest.warns(CheckpointWarning, match="unfinished save"):
        path = checkpoint.latest(tmp_path / "atomic")
    assert checkpoint.load(path)["step"] >= 1


def test_weights_only_refuses_a_pickle_that_calls_a_function(tmp_path, capsys):
    from lessons.fault_tolerance.security import pickle_with_code
    path = pickle_with_code(tmp_path / "x.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    assert "printed by a checkpoint" not in capsys.readouterr().out


# --- resuming labtools.train ------------------------------------------------------------------------------------------

CORPUS = data.synthetic()


def gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=CORPUS.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.1))


def cfg(**kw):
    base = dict(steps=24, batch_size=4, lr=3e-3, eval_every=6, eval_batches=2, progress=False,
                lr_schedule=bind(warmup_cosine, warmup=3, total=24))
    return TrainConfig(**(base | kw))


def test_an_interrupted_run_resumes_bitwise(tmp_path):
    whole_model = gpt()
    whole = train(whole_model, CORPUS, cfg())
    first = train(gpt(), CORPUS, cfg(checkpoint_dir=str(tmp_path), checkpoint_every=5, stop_at=13))
    assert len(first.loss) == 13 and checkpoint.latest(tmp_path).name == "step_00000010"
    resumed_model = gpt()
    resumed = train(resumed_model, CORPUS, cfg(checkpoint_dir=str(tmp_path), checkpoint_every=5))
    assert resumed.loss == whole.loss and resumed.val_loss == whole.val_loss and resumed.lr == whole.lr
    assert resumed.step == whole.step and resumed.val_step == whole.val_step
    for a, b in zip(whole_model.state_dict().values(), resumed_model.state_dict().values()):
        assert torch.equal(a, b)


def test_without_the_rng_and_data_position_the_run_differs(tmp_path):
    """The article's recipe (model, optimizer, step): a different run — the test above could fail."""
    from lessons import fault_tolerance as lesson
    from lessons.fault_tolerance import resume
    S = lesson.settings("smoke", steps=20, every=5, stop_at=12)
    r = resume.run(S, tmp_path)
    stats = resume.resume_stats(S, r)
    assert stats["lab_params_equal"] and stats["lab_losses_equal"]
    assert stats["article_param_diff"] > 1e-4 and stats["redone"] == 2


def test_a_checkpoint_of_another_model_shape_is_refused_clearly(tmp_path):
    train(gpt(), CORPUS, cfg(steps=6, checkpoint_dir=str(tmp_path)))
    torch.manual_seed(0)
    wider = GPT(GPTConfig(vocab_size=CORPUS.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=32))
    with pytest.raises(ValueError, match=r"does not fit this model: .* is \(.*\) there, \(.*\) here"):
        train(wider, CORPUS, cfg(steps=6, checkpoint_dir=str(tmp_path)))


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    train(gpt(), CORPUS, cfg(steps=6, checkpoint_dir=str(tmp_path), stop_at=3, checkpoint_every=2))
    with pytest.raises(ValueError, match="another run"):
        train(gpt(), CORPUS, cfg(steps=6, checkpoint_dir=str(tmp_path), seed=1))


@pytest.mark.parametrize("kw, match", [
    (dict(checkpoint_every=5), "needs a checkpoint_dir"),
    (dict(checkpoint_dir="x", keep_checkpoints=0), "keep_checkpoints"),
    (dict(stop_at=0), "stop_at"),
    (dict(stop_at=25), "stop_at"),
    (dict(checkpoint_dir="x", checkpoint_every=-1), "checkpoint_every"),
])
def test_train_config_checkpoint_fields_are_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        cfg(**kw)


def test_youngs_interval_minimises_the_first_order_waste():
    """Young (1974): waste = δ/τ (saving) + τ/(2·MTBF) (lost work); its minimum is at τ* = √(2·δ·MTBF). Worked by hand
    for δ = 60 s, MTBF = 6 h: τ* = √(2·60·21600) = 1609.97 s, where the two parts are equal (3.73% each)."""
    save_s, mtbf_s = 60.0, 6 * 3600.0
    tau = checkpoint.young_interval(save_s, mtbf_s)
    assert tau == pytest.approx(1609.9689, rel=1e-6)
    w = checkpoint.waste(tau, save_s, mtbf_s, restart_s=300.0)
    assert w["saving"] == pytest.approx(w["lost work"]) == pytest.approx(0.037268, rel=1e-4)
    assert w["restart"] == pytest.approx(300 / mtbf_s)
    total = lambda t: sum(checkpoint.waste(t, save_s, mtbf_s).values())  # noqa: E731
    assert total(tau) < min(total(0.9 * tau), total(1.1 * tau))
