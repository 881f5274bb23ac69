"""Lesson 00, the panel: layers and width against the loss a short run reaches (cached runs)."""

from dataclasses import replace

from labtools import data, plots
from labtools.controls import slider
from labtools.runcache import RunCache
from labtools.train import History
from labtools.widgets import Panel
from lessons.training_loop import Settings
from lessons.training_loop.training import train_run


def size_panel(S: Settings, corpus: data.Corpus, baseline: History) -> tuple[Panel, RunCache]:
    """Sliders for depth, width and steps; each new setting trains once (cached) and is drawn
    against the baseline run and the entropy floor."""

    def run(n_layer, n_embd, steps):
        n_head = 4 if n_embd % 4 == 0 else 1
        changed = replace(S, n_layer=n_layer, n_embd=n_embd, n_head=n_head)
        return train_run(changed, corpus, steps, f"L={n_layer} h={n_embd}", n_head=n_head)[1]

    cache = RunCache(run)
    cache.store[cache.key(dict(n_layer=S.n_layer, n_embd=S.n_embd, steps=S.steps))] = baseline

    def draw(n_layer, n_embd, steps):
        h = cache(n_layer=n_layer, n_embd=n_embd, steps=steps)
        runs = {f"baseline L={S.n_layer} h={S.n_embd}, {S.steps} steps": baseline}
        if h is not baseline:
            runs[f"L={n_layer} h={n_embd}, {steps} steps"] = h
        return plots.loss_curves(runs, floor=corpus.entropy_rate,
                                 title="Your runs against the baseline: how close each gets to the floor")

    controls = {
        "n_layer": slider(S.n_layer, 1, 8, description="layers", continuous=False),
        "n_embd": slider(S.n_embd, 32, 256, 32, description="width", continuous=False),
        "steps": slider(S.steps, 50, 4 * S.steps, 50, description="steps", continuous=False),
    }
    return Panel(draw, controls, title="Train a model of your choice (each new setting trains once)",
                 cancellable=True), cache
