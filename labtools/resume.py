"""What a training run saves to continue bit for bit, and how it continues: the model, the optimizer and the loss
scaler, both random generators (dropout's and the data's position), the history so far, and the run it belongs to.
labtools.train saves with it every `checkpoint_every` steps and resumes from the newest checkpoint (lesson 11)."""

import dataclasses
from pathlib import Path

import torch

from labtools import checkpoint


def save(directory, step: int, model, optimizer, scaler, g: torch.Generator, history: dict, *, seed: int,
         start_step: int, steps: int, keep: int) -> Path:
    """The whole training state after `step` steps: what a resumed run needs to continue bit for bit."""
    config = model.config
    return checkpoint.save(
        directory, step, keep=keep,
        model=model.state_dict(), optimizer=optimizer.state_dict(),
        scaler=scaler.state_dict() if hasattr(scaler, "state_dict") else {},
        rng=checkpoint.rng_state(g),  # dropout (torch's global generator) and the data position (g)
        history=history,
        run={"seed": seed, "start_step": start_step, "steps": steps,
             "model_config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}})


def resume(path: Path, model, optimizer, scaler, g: torch.Generator, seed: int, start_step: int,
           end: int) -> tuple[int, dict]:
    """Restore a checkpoint save() wrote into this run's objects; returns the step to continue from and the history
    saved with it. Refuses a checkpoint of another run (seed, first step) or outside (start_step, end]."""
    state = checkpoint.load(path, map_location=next(model.parameters()).device)
    run, step = state["run"], state["step"]
    if run["seed"] != seed or run["start_step"] != start_step:
        raise ValueError(f"{path} belongs to another run (seed {run['seed']}, start_step {run['start_step']}; this "
                         f"one: {seed}, {start_step}): use an empty checkpoint_dir for a new run")
    if not start_step < step <= end:
        raise ValueError(f"{path} is at step {step}, outside this run's steps ({start_step}, {end}]")
    checkpoint.load_model_state(model, state["model"], where=str(path))
    optimizer.load_state_dict(state["optimizer"])
    if state["scaler"]:
        scaler.load_state_dict(state["scaler"])
    checkpoint.set_rng_state(state["rng"], g)
    return step, state["history"]
