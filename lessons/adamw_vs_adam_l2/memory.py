"""Lesson 01, section 4: optimizer state per parameter, from torch's own state."""

import plotly.graph_objects as go
import torch

from labtools import plots
from labtools.claims import Findings, Ledger, at_most
from labtools.device import pick_device
from labtools.optim import SGD, Adafactor, Adam, AdamW, Lion, state_bytes
from lessons.adamw_vs_adam_l2 import Settings, build_model, corpus

SEED_TABLE = {"SGD": 0, "SGD + momentum": 4, "Adam": 8, "AdamW": 8, "Lion": 4, "Adafactor": 4}


def table(S: Settings) -> dict[str, dict]:
    """Optimizer state bytes per parameter, measured after one step on the lesson's GPT, ours and torch's."""
    makers = {
        "SGD": (lambda p: SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
        "SGD + momentum": (lambda p: SGD(p, lr=0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
        "Adam": (lambda p: Adam(p), lambda p: torch.optim.Adam(p)),
        "AdamW": (lambda p: AdamW(p, weight_decay=0.1), lambda p: torch.optim.AdamW(p, weight_decay=0.1)),
        "Lion": (lambda p: Lion(p), None),
        "Adafactor": (lambda p: Adafactor(p), lambda p: torch.optim.Adafactor(p)),
    }
    text = corpus(S)
    X, Y = text.batch("train", 4, S.block_size, torch.Generator().manual_seed(0), pick_device())
    out = {}
    for name, (ours, theirs) in makers.items():
        row = {"seeds": SEED_TABLE[name]}
        for label, make in (("ours", ours), ("torch", theirs)):
            if make is None:
                row[label] = None
                continue
            model = build_model(S, text.vocab_size)
            opt = make(model.parameters())
            model(X, Y)[1].backward()
            opt.step()
            row[label] = state_bytes(opt) / model.num_params()
        out[name] = row
    return out


def figure(table: dict[str, dict]) -> go.Figure:
    names = list(table)
    return plots.bars(names, {"commonly quoted table": [table[n]["seeds"] for n in names],
                              "measured (ours)": [table[n]["ours"] for n in names],
                              "measured (torch.optim)": [table[n]["torch"] or 0 for n in names]},
                      title="Optimizer state, bytes per parameter (fp32)", yaxis="bytes / parameter")


def findings(ledger: Ledger, memory: dict[str, dict]) -> Findings:
    quoted = {name: row for name, row in memory.items() if name != "Adafactor"}
    measured = {name: row["torch"] if row["torch"] is not None else row["ours"] for name, row in quoted.items()}
    ledger.add("mem_quoted", "SGD, SGD + momentum, Adam, AdamW and Lion keep the quoted bytes of state per parameter "
               "(worst |measured − quoted| bytes/param; torch.optim's, ours for Lion, which torch lacks)",
               max(abs(measured[n] - row["seeds"]) for n, row in quoted.items()), at_most(0.01),
               source="a commonly quoted table", kind="measured")
    a = memory["Adafactor"]
    ledger.add("mem_adafactor", "torch.optim.Adafactor (no momentum) keeps far less than the quoted ≈4 "
               "bytes/param: row and column factors only", a["torch"], at_most(1.0),
               source="a commonly quoted table: ≈ 4", kind="measured")
    ledger.add("mem_ours_as_torch", "The lab's optimizers keep what torch's keep (worst |ours − torch| bytes/param)",
               max(abs(r["ours"] - r["torch"]) for r in memory.values() if r["torch"] is not None), at_most(0.01),
               kind="measured", detail=True)
    ledger.note("memory_bytes_per_param", memory)
    table = ("| optimizer | quoted | measured (the lab's) | measured (torch.optim) |\n|---|---|---|---|\n"
             + "\n".join(f"| {n} | {r['seeds']} | {r['ours']:.3f} | "
                         f"{'—' if r['torch'] is None else format(r['torch'], '.3f')} |" for n, r in memory.items()))
    return Findings([
        "As quoted for SGD, momentum, Adam, AdamW and Lion: Adam keeps two fp32 numbers per parameter, 8 bytes.",
        f"Adafactor keeps far less than the quoted 4 bytes: **{a['torch']:.2f}** per parameter, since without "
        "momentum it stores one row and one column factor per matrix.",
    ], [
        table,
        "torch's Adam and AdamW come out a hair above 8: they keep the step count as a one-element tensor per "
        "parameter tensor.",
    ])
