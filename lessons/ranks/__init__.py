"""Functions that run inside torchrun ranks, one module per multi-process lesson.

They import torch and core labtools only — never plotly, ipywidgets, IPython or nbformat — so a rank starts
in a fraction of the time a notebook-side lesson module takes to import (tests/test_ranks.py checks it).
Each rank function takes one config dataclass (rebuilt from JSON inside the rank) and returns a dict.
"""
