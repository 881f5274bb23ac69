"""Lesson 11, section 3: a checkpoint is code unless loaded with weights_only=True."""

from pathlib import Path

import torch

from labtools.claims import Findings, Ledger, is_true
from lessons.fault_tolerance.crashes import try_load


class _Payload:
    """Unpickling this object calls print(...): any callable could stand in its place (os.system, …)."""

    def __reduce__(self):
        return (print, ("this line was printed by a checkpoint file while it was being loaded",))


def pickle_with_code(path: Path) -> Path:
    torch.save({"model": {"w": torch.zeros(2)}, "note": _Payload()}, path)
    return path


def run(workdir: Path) -> dict:
    path = pickle_with_code(workdir / "suspicious.pt")
    return {"weights_only": try_load(lambda: torch.load(path, weights_only=True))}


def findings(ledger: Ledger, sec: dict) -> Findings:
    ok, msg = sec["weights_only"]
    ledger.add("weights_only", "torch.load(weights_only=True) refuses a checkpoint whose pickle would call a "
               "function (measured)", not ok, is_true(), kind="measured")
    error = msg.split("; ")[-1].split(":")[0]  # the exception's type: its text is torch's internals
    return Findings([f"Only as data: `torch.load(path, weights_only=True)` refused the file with an `{error}` before "
                     "its call could run: a weights-only load calls no function a pickle names."
                     if not ok else "Not here: `torch.load(path, weights_only=True)` loaded the file, call and all."])
