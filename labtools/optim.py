"""Optimizer helpers: parameter groups with no weight decay for biases and norms."""

import torch.nn as nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices and embeddings (dim >= 2) decay; biases and LayerNorm gains (dim < 2) do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
