"""Lesson 16 — plan a training run: every lesson's piece in one planner, checked against published runs and
calibrated on this machine.

The settings of notebooks/16_plan_a_run.ipynb. One module per section:

    example.py          the running example: a 70B model on 2,048 H100s, its layouts ranked, the whole run
    memory_exercise.py  your turn: the model states each GPU holds under a layout
    reproduced.py       published figures recomputed from their papers' own inputs
    predicted.py        Llama 3's, MT-NLG's and GPT-3's layouts predicted from one calibrated row; DeepSeek-V3
    calibration.py      this machine measured, the planner's prediction of a 2-rank run beside that run
    planner.py          a panel: plan your own run
    every_layout.py     one model under eight layouts on four real ranks, each beside one process; a panel
    ranks.py            what runs inside the ranks (torch and core labtools only)
"""

from dataclasses import dataclass

from labtools.budget import architecture
from labtools.config import LabConfig, gpt_config, resolve
from labtools.device import pick_device
from labtools.memory import check_fits
from labtools.plan import CLUSTERS, GPU

GB = 1e9
WORLD = 2  # ranks of the calibration and of the runs it predicts
A100, H100 = CLUSTERS[GPU.A100], CLUSTERS[GPU.H100]


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    rounds: int           # alternating rounds of (one rank alone, two ranks with DDP, the all-reduces)
    matmul_sizes: tuple   # n of the n×n matrix products that measure this machine's peak

    RANGES = {"ROUNDS": (1, 100), "BATCH_SIZE": (1, 1024)}


# A small batch of short sequences keeps each rank's compute small beside its gradient all-reduce, so that the
# prediction has communication to get right (with no communication the planner would be right by construction).
# At smoke, width 256: at 128 the all-reduce (2.1 ms) was small beside a 6.2 ms step whose timing moves by as much,
# and the measured step fell half-way between the predictions with and without it (claim calibrated_needs_comm
# -0.02 on a quiet machine, -0.019 in CI); at 256 it is 5-9 ms of 18-34 ms, and the claim's margin 0.24-0.29 even
# beside a busy core.
PROFILES = {
    "smoke": Settings(profile="smoke", n_layer=2, n_embd=256, n_head=4, block_size=16, batch_size=1, steps=3,
                      rounds=5, matmul_sizes=(128, 256)),
    "cpu": Settings(profile="cpu", n_layer=4, n_embd=192, n_head=6, block_size=32, batch_size=1, steps=5,
                    rounds=7, matmul_sizes=(128, 256, 512)),
    "gpu": Settings(profile="gpu", n_layer=12, n_embd=768, n_head=12, block_size=256, batch_size=4, steps=10,
                    rounds=7, matmul_sizes=(1024, 4096)),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value. A BATCH_SIZE whose
    calibration would not fit this machine is refused with the numbers."""
    S = resolve(PROFILES, profile, **overrides)
    cfg = gpt_config(S)
    arch = architecture(S.n_layer, S.n_embd, S.n_head, cfg.vocab_size, S.block_size, S.batch_size,
                        bytes_per_element=4)
    # each of the WORLD ranks holds three copies of the model with gradients and AdamW's two moments (16 bytes a
    # parameter in fp32) and one step's activations at a time, all on this machine unless each rank has a GPU
    device = pick_device()
    need = (3 * 16 * arch.n_params + arch.activations["total"]) * (1 if device.type == "cuda" else WORLD)
    check_fits("BATCH_SIZE", S.batch_size, need, device, f"{WORLD} ranks' models, optimizer states and activations")
    return S
