"""Checkpoints that survive a crash: written atomically, verified by hash, loaded as data, never as code.

    path = checkpoint.save("ckpt", step, model=model.state_dict(), optimizer=opt.state_dict(), rng=rng_state())
    path = checkpoint.latest("ckpt")          # the newest checkpoint that verifies, or None
    state = checkpoint.load(path)             # verified, then torch.load(weights_only=True)

A checkpoint is a directory `step_00001234/` holding `state.pt` and `manifest.json` (the step, and the size and
sha256 of every file). It is written as a hidden `.tmp-…` directory — state first (fsync), manifest last (fsync),
the directory itself fsynced — and only then renamed to its final name: a rename within one filesystem is atomic,
so a reader sees the whole checkpoint or none of it. A process killed mid-save leaves only the `.tmp-…`
directory, which `latest()` skips (and `save()` clears away later). Old checkpoints are deleted only after the
new one was read back and verified, so at least one good checkpoint exists at every moment.

`load()` checks the manifest's hashes *before* unpickling, so a truncated or altered file is refused without
being parsed, and unpickles with `weights_only=True`: tensors, numbers, strings, lists and dicts only — a
checkpoint from elsewhere cannot run code. Introduced in notebooks/11_fault_tolerance.ipynb.

Also here: save_checkpoint/load_checkpoint (model, optimizer and step in one file; lesson 02), and how often to
save — waste(interval, save time, MTBF) and Young's interval √(2·δ·MTBF) (lesson 11).
"""

import hashlib
import json
import math
import os
import random
import re
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

STATE = "state.pt"
MANIFEST = "manifest.json"
FORMAT = 1
_NAME = re.compile(r"^step_(\d{8,})$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be trusted: missing manifest, a file missing, of the wrong size or hash."""


class CheckpointWarning(UserWarning):
    """latest() skipped a checkpoint (its message names the directory and the reason)."""


# --- writing ----------------------------------------------------------------------------------------------------

def sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def name(step: int) -> str:
    return f"step_{step:08d}"


def _check_directory(directory) -> Path:
    if not isinstance(directory, (str, os.PathLike)) or not str(directory):
        raise ValueError(f"a checkpoint directory must be a path, got {directory!r}")
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"{directory} is a file, not a checkpoint directory")
    return directory


def save(directory, step: int, *, keep: int = 3, **state) -> Path:
    """Write `state` (tensors, numbers, strings, lists, dicts) as checkpoint `step` under `directory` and
    return its path; then delete all but the newest `keep` verified checkpoints."""
    directory = _check_directory(directory)
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ValueError(f"keep must be an int >= 1 (the newest checkpoint is never deleted), got {keep!r}")
    if not state:
        raise ValueError("nothing to save: pass the state as keyword arguments, e.g. model=model.state_dict()")
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / name(step)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name(step)}-", dir=directory))
    try:
        _write_synced(tmp / STATE, lambda f: torch.save(state, f))
        manifest = {"format": FORMAT, "step": step, "time": time.time(),
                    "files": {STATE: {"bytes": (tmp / STATE).stat().st_size, "sha256": sha256(tmp / STATE)}}}
        _write_synced(tmp / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
        _fsync_dir(tmp)
        if final.exists():  # saving the same step again: the old copy goes only once the new one is in place
            old = directory / f".old-{name(step)}-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    verify(final)
    _prune(directory, keep, newest=final)
    return final


def _prune(directory: Path, keep: int, newest: Path) -> None:
    """Delete checkpoints beyond the newest `keep` (the one just verified counts), and leftovers of saves
    that a crash interrupted (hidden .tmp-/.old- directories of processes that are gone)."""
    ckpts = checkpoints(directory)
    for old in ckpts[:-keep] if len(ckpts) > keep else []:
        if old != newest:
            shutil.rmtree(old, ignore_errors=True)
    for left in directory.glob(".tmp-step_*"):
        if time.time() - left.stat().st_mtime > 60:  # another live process may be mid-save in a shared directory
            shutil.rmtree(left, ignore_errors=True)


# --- reading ----------------------------------------------------------------------------------------------------

def checkpoints(directory) -> list[Path]:
    """Finished checkpoint directories (renamed into place), oldest first; not checked."""
    directory = _check_directory(directory)
    if not directory.exists():
        raise FileNotFoundError(f"checkpoint directory {directory} does not exist")
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def verify(path) -> dict:
    """The manifest of checkpoint `path` if every file it lists is there with its size and sha256; else
    CheckpointError saying which file and why. Reads bytes only: nothing is unpickled."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path / MANIFEST}: missing (the save did not finish)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path / MANIFEST}: unreadable ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT \
            or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{path / MANIFEST}: not a format-{FORMAT} manifest")
    for fname, meta in manifest["files"].items():
        if not (isinstance(meta, dict) and isinstance(meta.get("bytes"), int) and isinstance(meta.get("sha256"), str)):
            raise CheckpointError(f"{path / MANIFEST}: the entry for {fname} lacks its bytes or sha256")
        f = path / fname
        if not f.is_file():
            raise CheckpointError(f"{f}: missing")
        size = f.stat().st_size
        if size != meta["bytes"]:
            raise CheckpointError(f"{f}: {size:,} bytes, the manifest says {meta['bytes']:,} (truncated or rewritten)")
        if sha256(f) != meta["sha256"]:
            raise CheckpointError(f"{f}: sha256 differs from the manifest (the bytes were altered)")
    return manifest


def latest(directory) -> Path | None:
    """The newest checkpoint under `directory` that verifies, or None if there is none. Each newer one that
    does not verify is skipped with a CheckpointWarning naming the file and the reason."""
    directory = _check_directory(directory)
    for unfinished in sorted(directory.glob(".tmp-step_*")) if directory.exists() else []:
        warnings.warn(f"skipping {unfinished}: an unfinished save (never renamed into place)", CheckpointWarning,
                      stacklevel=2)
    for path in reversed(checkpoints(directory)):
        try:
            verify(path)
        except CheckpointError as e:
            warnings.warn(f"skipping {path.name}: {e}", CheckpointWarning, stacklevel=2)
            continue
        return path
    return None


def load(path, map_location="cpu") -> dict:
    """The state saved in checkpoint `path`, verified first, then unpickled with weights_only=True."""
    path = Path(path)
    manifest = verify(path)
    state = torch.load(path / STATE, map_location=map_location, weights_only=True)
    state.setdefault("step", manifest["step"])
    return state


# --- random number generators -------------------------------------------------------------------------------------

def rng_state(*generators: torch.Generator) -> dict:
    """Every random number generator a training step may draw from — torch's (CPU, and CUDA if present),
    numpy's, Python's — and the given torch.Generators (e.g. the data sampler's), as plain tensors and lists."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, mt, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "gauss": float(gauss)},
            "python": {"version": version, "state": list(mt), "gauss_next": gauss_next},
            "generators": [g.get_state() for g in generators]}


def set_rng_state(state: dict, *generators: torch.Generator) -> None:
    """Restore what rng_state() returned (the same generators, in the same order)."""
    if len(state["generators"]) != len(generators):
        raise ValueError(f"the checkpoint holds {len(state['generators'])} generator state(s), "
                         f"{len(generators)} generator(s) given")
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
    for g, s in zip(generators, state["generators"]):
        g.set_state(s)


# --- restoring a model --------------------------------------------------------------------------------------------

def load_model_state(model: torch.nn.Module, saved: dict, where: str = "the checkpoint") -> None:
    """model.load_state_dict(saved), after checking every tensor's name and shape, with an error that names
    the first mismatch (a checkpoint of a different model shape)."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or unexpected:
        raise ValueError(f"{where} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for key, t in own.items():
        if tuple(saved[key].shape) != tuple(t.shape):
            raise ValueError(f"{where} does not fit this model: {key} is {tuple(saved[key].shape)} there, "
                             f"{tuple(t.shape)} here (a different model shape)")
    model.load_state_dict(saved)


def digest(state: dict) -> str:
    """sha256 over every tensor of a (nested) state dict, in key order: equal digests = bitwise-equal states."""
    h = hashlib.sha256()

    def walk(prefix, value):
        if isinstance(value, dict):
            for k in sorted(value, key=str):
                walk(f"{prefix}.{k}", value[k])
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}.{i}", v)
        elif torch.is_tensor(value):
            t = value.detach().cpu().contiguous().reshape(-1)
            h.update(f"{prefix}:{value.dtype}:{tuple(value.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(f"{prefix}={value!r}".encode())
    walk("", state)
    return h.hexdigest()


# --- how often to save (notebook 11) -----------------------------------------------------------------------

def waste(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0) -> dict:
    """First-order expected waste per unit of time (Young 1974): saving (δ/τ), work lost since the last save
    (τ/2 per failure) and the restart, per failure (÷ MTBF). Fractions of the run's time."""
    return {"saving": save_s / interval_s, "lost work": interval_s / 2 / mtbf_s, "restart": restart_s / mtbf_s}


def young_interval(save_s: float, mtbf_s: float) -> float:
    """The interval that minimises waste(): √(2·δ·MTBF)."""
    return math.sqrt(2 * save_s * mtbf_s)
