"""Published training runs as their authors reported them, each figure with its source: one home for lessons 11,
12, 15 and 16. Every number here is as published (a correction, where the course makes one, is stated beside it);
nothing is measured or computed. The model shapes are in labtools.shapes.

    GPT3, LLAMA3, MTNLG_RUN, DEEPSEEK_V3_RUN    PublishedRun: FLOPs, tokens, GPUs, the layouts and their throughput
    PUBLISHED                                   the runs lesson 12 recomputes
    PER_TOKEN_GFLOPS                            training FLOPs per token at 4,096 tokens, as DeepSeek-AI published them
    LLAMA3_JOB_MTBF_H, LLAMA3_GPU_MTBF_H        Llama 3's interruptions, as a mean time between failures
"""

from dataclasses import dataclass

from labtools.layout import Layout


@dataclass(frozen=True)
class LayoutResult:
    """One layout of a published run and the throughput it reached."""
    name: str
    layout: Layout
    batch: int                 # sequences per step
    seq: int                   # tokens per sequence
    tflops: float              # per GPU, as published
    step_s: float | None = None  # seconds per step, as published
    mfu: float | None = None   # as published

    @property
    def gpus(self) -> int:
        return self.layout.world


@dataclass(frozen=True)
class PublishedRun:
    """A training run as its authors reported it."""
    name: str
    n_params: float
    tokens: float
    flops: float | None        # training FLOPs, as published
    peak_flops: float          # per GPU, dense bf16 (vendor figure)
    source: str
    layouts: tuple[LayoutResult, ...] = ()
    days: float | None = None  # as published
    gpu_hours: float | None = None
    seq: int | None = None     # tokens per sequence, where one length served the whole run
    counts_recompute: bool = False  # its TFLOP/s count the recomputed forward (Megatron-LM's hardware FLOPs)


@dataclass(frozen=True)
class ExpertLayout:
    """How a mixture of experts was spread: GPUs, pipeline stages, and ranks the experts are split over."""
    gpus: int
    pp: int
    ep: int


# Brown et al. 2020, table D.1: 3.14e23 FLOPs for 175B parameters on 300B tokens. Narayanan et al. 2021, section
# 5.1: a benchmarked configuration on 1,024 A100s (tp 8 × pp 16 × dp 8, batch 1536) at 140 teraFLOP/s each, with
# activation recomputation counted, hence their estimate of "about 34 days" (from 8·T·P/(n·X)); not a run OpenAI
# reported.
GPT3 = PublishedRun("GPT-3 175B", 175e9, 300e9, 3.14e23, 312e12, "Brown et al. 2020; Narayanan et al. 2021",
                    layouts=(LayoutResult("GPT-3 175B, 1,024 GPUs", Layout(8, 8, 16), batch=1536, seq=2048,
                                          tflops=140),),
                    days=34, counts_recompute=True)

# Llama 3 405B (Dubey et al. 2024): 3.8e25 FLOPs on 15.6T tokens (section 3.2.1); table 4's layouts, 16M tokens per
# step each, their TFLOP/s per GPU and BF16 MFU (the same figures were shown at SC'24). The paper prints dp 4 for the
# long-context row, but 8 × 16 × 16 × 4 makes 8,192 GPUs, not the row's 16,384: the course uses dp 8, which makes
# the row's GPUs and its 16M tokens per step (128 sequences of 131,072) agree.
LLAMA3_LONG_DP_PRINTED = 4
LLAMA3 = PublishedRun("Llama 3 405B", 405e9, 15.6e12, 3.8e25, 989e12, "Dubey et al. 2024", layouts=(
    LayoutResult("8,192 GPUs", Layout(64, 8, 16), batch=2048, seq=8192, tflops=430, mfu=0.43),
    LayoutResult("16,384 GPUs", Layout(128, 8, 16), batch=2048, seq=8192, tflops=400, mfu=0.41),
    LayoutResult("16,384 GPUs, 128K context", Layout(8, 8, 16, 16), batch=128, seq=131072, tflops=380, mfu=0.38),
))
# Llama 3 405B: 419 unexpected interruptions in 54 days of pre-training on up to 16,384 GPUs (Dubey et al. 2024,
# section 3.3.4): one every 3.1 hours for the job, a mean time between failures of about 51,000 hours per GPU if
# failures scale with the GPU count.
LLAMA3_INTERRUPTIONS, LLAMA3_PRETRAIN_DAYS, LLAMA3_GPUS = 419, 54, 16384
LLAMA3_JOB_MTBF_H = LLAMA3_PRETRAIN_DAYS * 24 / LLAMA3_INTERRUPTIONS
LLAMA3_GPU_MTBF_H = LLAMA3_JOB_MTBF_H * LLAMA3_GPUS

# Megatron-Turing NLG 530B (Smith et al. 2022, section 2.4): batch 1920 of 2048 tokens on 280, 350 and 420 DGX A100
# nodes (tp 8 × pp 35 × dp 8, 10, 12), 60.1, 50.2 and 44.4 s per step: 126, 121 and 113 teraFLOP/s per GPU, counted
# as Megatron-LM counts them (recomputation included).
MTNLG_RUN = PublishedRun("MT-NLG 530B", 530e9, 270e9, None, 312e12, "Smith et al. 2022", layouts=(
    LayoutResult("MT-NLG 530B, 2,240 GPUs", Layout(8, 8, 35), batch=1920, seq=2048, tflops=126, step_s=60.1),
    LayoutResult("MT-NLG 530B, 2,800 GPUs", Layout(10, 8, 35), batch=1920, seq=2048, tflops=121, step_s=50.2),
    LayoutResult("MT-NLG 530B, 3,360 GPUs", Layout(12, 8, 35), batch=1920, seq=2048, tflops=113, step_s=44.4),
), counts_recompute=True)

# DeepSeek-V3 (DeepSeek-AI 2024): 14.8T tokens of 4,096 on 2,048 H800s (pp 16, ep 64 across 8 nodes, ZeRO-1 data
# parallelism), 2.664M GPU-hours of pre-training. Its shape is labtools.shapes.DEEPSEEK_V3.
DEEPSEEK_V3_RUN = PublishedRun("DeepSeek-V3", 671e9, 14.8e12, None, 989e12, "DeepSeek-AI 2024", gpu_hours=2.664e6,
                               seq=4096)
DEEPSEEK_V3_LAYOUT = ExpertLayout(gpus=2048, pp=16, ep=64)

# Training FLOPs per token at 4,096 tokens per sequence, as DeepSeek-AI published them (Zhao et al. 2025, "Insights
# into DeepSeek-V3", table 2): 250 GFLOPs for DeepSeek-V3, 2,448 for Llama 3.1 405B.
PER_TOKEN_SEQ = 4096
PER_TOKEN_GFLOPS = {"DeepSeek-V3": 250, "Llama 3 405B": 2448}

PUBLISHED = (GPT3, LLAMA3)  # lesson 12 recomputes their FLOPs and GPT-3's days
