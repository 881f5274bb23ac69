"""Lesson 22 — Inside the kernel: FlashAttention written in Triton, and FP8 matmuls with their scales.

The settings of notebooks/22_flash_attention_and_fp8.ipynb. One module per section:

    flash_exercise.py   section 1, your turn: the forward kernel's online softmax and causal tiles, checked against
                        PyTorch's fused attention (values, log-sum-exp, and the key tiles read)
    tiling.py           section 2: bytes moved per tile size (counted in the kernel), memory kept for the backward
                        against the sequence length (measured); on a GPU, the kernel timed
    flash_gpt.py        section 3: your kernel inside a GPT, its gradients against PyTorch's attention, a short run
    scales.py           section 4: FP8's two formats and four ways to scale a tensor: the error of each, an
                        outlier's harm, real gradients stored without a scale
    quant_exercise.py   section 4, your turn: the fine-grained quantiser, checked against the lab's
    fp8_training.py     section 5: a GPT trained with FP8 matmuls against bf16 ones, over seeds; a recipe without scales

The model fields (n_layer, n_embd, n_head, block_size, batch_size, steps, lr) are section 5's FP8 training run's;
section 3's GPT is the flash_* fields' (a head dimension of 16, the smallest tl.dot takes).
"""

from dataclasses import dataclass

from labtools.config import LabConfig, resolve
from labtools.kernels import check_blocks
from labtools.validate import check_range


@dataclass(frozen=True, kw_only=True)
class Settings(LabConfig):
    block_q: int            # the kernel's query tile (rows of the score matrix a program holds)
    block_k: int            # its key tile
    lengths: tuple          # sequence lengths s whose memory and bytes are measured (section 2)
    head_dim: int = 16      # d_h, the head size of section 2's attention
    flash_embd: int = 32    # section 3's GPT: width, heads (d_h = width ÷ heads), blocks, sequence, batch
    flash_heads: int = 2
    flash_layers: int = 1
    flash_len: int = 32
    flash_batch: int = 2
    flash_steps: int        # its short run, with your kernel and with PyTorch's attention
    outlier: float = 1e5     # section 4: one entry this many times the tensor's typical size
    seeds: int              # section 5's runs, each recipe over this many seeds
    confidence: float = 0.95

    RANGES = {"FLASH_STEPS": (1, 1000), "SEEDS": (1, 100), "OUTLIER": (1, 1e7)}

    def __post_init__(self):
        super().__post_init__()
        check_blocks(self.block_q, self.block_k)
        check_range("CONFIDENCE", self.confidence, 0.0, 1.0, open_lo=True, open_hi=True)
        if self.n_embd % 128:  # DeepSeek-V3's 128 × 128 weight blocks and 1 × 128 tiles must cut the layers
            raise ValueError(f"N_EMBD must be a multiple of 128 for 128 × 128 blocks, got {self.n_embd}")
        if self.flash_embd // self.flash_heads not in (16, 32, 64):
            raise ValueError("FLASH_EMBD ÷ FLASH_HEADS (the head dimension) must be 16, 32 or 64, got "
                             f"{self.flash_embd} ÷ {self.flash_heads}")


_COMMON = dict(n_layer=1, n_embd=128, n_head=4, block_size=32, batch_size=8, lr=1e-3, block_q=16, block_k=16)
PROFILES = {
    "smoke": Settings(profile="smoke", steps=60, seeds=3, lengths=(32, 64, 128), flash_steps=4, **_COMMON),
    "cpu": Settings(profile="cpu", steps=300, seeds=5, lengths=(64, 128, 256, 512), flash_steps=20, **_COMMON),
    "gpu": Settings(profile="gpu", steps=400, seeds=8, lengths=(256, 512, 1024, 2048, 4096), flash_steps=50,
                    **_COMMON),
}


def settings(profile: str = "auto", **overrides) -> Settings:
    """Validated settings for a profile; None-valued overrides keep the profile's value."""
    return resolve(PROFILES, profile, **overrides)
