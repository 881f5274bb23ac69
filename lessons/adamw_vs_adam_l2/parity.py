"""Lesson 01, section 0: each from-scratch optimizer against the torch.optim one it teaches."""

import torch

from labtools.claims import Findings, Ledger, at_most
from labtools.optim import SGD, Adafactor, Adam, AdamL2, AdamW, max_divergence


def run() -> dict[str, float]:
    """max |θ_ours − θ_torch| after 25 steps on random parameters and gradients, per optimizer."""
    kw = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    pairs = {
        "SGD + momentum": (lambda p: SGD(p, lr=0.05, momentum=0.9),
                           lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
        "Adam": (lambda p: Adam(p, **kw), lambda p: torch.optim.Adam(p, **kw)),
        "Adam + L2": (lambda p: AdamL2(p, weight_decay=0.1, **kw),
                                         lambda p: torch.optim.Adam(p, weight_decay=0.1, **kw)),
        "AdamW": (lambda p: AdamW(p, weight_decay=0.1, **kw), lambda p: torch.optim.AdamW(p, weight_decay=0.1, **kw)),
        "Adafactor": (lambda p: Adafactor(p), lambda p: torch.optim.Adafactor(p)),
    }
    return {name: max_divergence(a, b) for name, (a, b) in pairs.items()}


def findings(ledger: Ledger, parity_diffs: dict[str, float]) -> Findings:
    worst = max(parity_diffs.values())
    ledger.add("parity", "Each from-scratch optimizer matches torch.optim (max |Δθ| after 25 steps)", worst,
               at_most(1e-6), kind="measured", detail=True)
    table = ("| optimizer | largest weight difference from torch's after 25 steps |\n|---|---|\n"
             + "\n".join(f"| {name} | {d:.0e} |" for name, d in parity_diffs.items()))
    return Findings(["Yes, to float rounding: what the lab's optimizers measure below is what torch's would."],
                    [table, "Adam + L2 is compared with torch's Adam given a weight decay, which is the L2 form."])
