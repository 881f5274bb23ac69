"""Lesson 05, section 4: the panel — depth, sequence, batch and policy → saved activations."""

import math

import ipywidgets as W
import plotly.graph_objects as go

from labtools import plots
from labtools.controls import slider
from labtools.runcache import RunCache
from labtools.widgets import Panel
from lessons.activation_checkpointing import MiB, Settings, measure


def memory_panel(S: Settings) -> Panel:
    """Pick depth, length, batch and policy: the predicted bytes (instant) beside a measured forward pass (cached)."""
    cache = RunCache(lambda **kw: measure(S, **kw))

    def draw(n_layer, seq_len, batch_size, policy):
        k = max(1, round(math.sqrt(n_layer))) if policy == "every_k" else 1
        r = cache(n_layer=n_layer, seq_len=seq_len, batch_size=batch_size, policy=policy, k=k)
        fig = go.Figure([
            go.Bar(x=["predicted", "measured"], y=[r["predicted_blocks"] / MiB, 0], name="blocks",
                   marker_color=plots.color(0)),
            go.Bar(x=["predicted", "measured"], y=[r["predicted_outside"] / MiB, 0], name="embedding, head, loss",
                   marker_color=plots.color(1)),
            go.Bar(x=["predicted", "measured"], y=[0, r["measured"] / MiB], name="measured (saved tensors)",
                   marker_color=plots.color(2)),
        ])
        same = r["predicted"] == r["measured"]
        plots.style(fig, f"Saved activations: {r['measured'] / MiB:.2f} MiB measured, "
                           + ("exactly as predicted" if same else f"{r['predicted'] / MiB:.2f} MiB predicted"), "",
                    "MiB", barmode="stack")
        return fig

    controls = {
        "n_layer": slider(8, 1, 24, description="layers L", continuous=False),
        "seq_len": slider(S.seq_len, 16, 512, 16, description="sequence s", continuous=False),
        "batch_size": slider(S.batch_size, 1, 32, description="batch b", continuous=False),
        "policy": W.Dropdown(options=["none", "attn", "mlp", "block", "every_k"], value="block", description="policy"),
    }
    return Panel(draw, controls, title="Predicted and measured activation memory")
