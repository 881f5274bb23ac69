"""Device choice, and a short report of what this machine can do (folded with the run's settings at the top of
every lesson: run_setup)."""

import html
import os
import platform
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path

import torch


def pick_device(prefer: str | None = None) -> torch.device:
    """cuda > mps > cpu, or the device named by `prefer` (raising if it is not available)."""
    if prefer is not None:
        dev = torch.device(prefer)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but CUDA is not available")
        if dev.type == "mps" and not torch.backends.mps.is_available():
            raise ValueError("device 'mps' requested but MPS is not available")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def device_name(device: torch.device | str | None = None) -> str:
    """A human name for the device: the GPU model, or the CPU's."""
    dev = torch.device(device) if device is not None else pick_device()
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "mps":
        return "Apple MPS"
    try:  # Linux names the model; elsewhere the architecture will do
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        model = ""
    return model or platform.processor() or platform.machine() or "cpu"


NATIVE_16BIT = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}  # CPU flags of 16-bit units


def cpu_flags() -> list[str]:
    """The CPU's native low-precision features (Linux): what decides whether fp16/bf16 math is fast here."""
    cpuinfo = Path("/proc/cpuinfo")
    if platform.system() != "Linux" or not cpuinfo.exists():
        return []
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("flags")), [])
    return sorted(f for f in flags if f in {"avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile",
                                            "avx_vnni", "f16c"})


def cpu_has_units(precision: str) -> bool:
    """Does this CPU compute in `precision` ("bf16" or "fp16") natively, rather than through fp32 conversions?"""
    return any(f in cpu_flags() for f in NATIVE_16BIT[precision])


def dtype_supported(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Does a small matmul in `dtype` run on `device`? (Supported, not necessarily fast.)"""
    try:
        a = torch.ones(4, 4, dtype=dtype, device=device)
        (a @ a).sum().item()
        return True
    except (RuntimeError, TypeError):
        return False


def report(device: torch.device | str | None = None) -> dict:
    """Environment facts every lesson prints at the top: versions, device, threads, formats."""
    dev = torch.device(device) if device is not None else pick_device()
    info = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(dev),
        "device_name": device_name(dev),
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "bf16": dtype_supported(torch.bfloat16, dev),
        "fp16": dtype_supported(torch.float16, dev),
    }
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["bf16_native"] = torch.cuda.is_bf16_supported()
    else:
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return info


@dataclass(frozen=True)
class RunSetup:
    """What a lesson's run was made with: its settings and this machine (report()), folded under one line."""
    settings: object
    machine: dict

    def summary(self) -> str:
        m = self.machine
        threads = f", {m['cpu_threads']} thread{'s' * (m['cpu_threads'] != 1)}" if m["device"] == "cpu" else ""
        return (f"This run: the <code>{html.escape(str(getattr(self.settings, 'profile', '?')))}</code> profile on "
                f"{html.escape(m['device_name'])} ({html.escape(m['device'])}{threads})")

    def _repr_html_(self) -> str:
        rows = [(f.name, getattr(self.settings, f.name)) for f in fields(self.settings)] \
            if is_dataclass(self.settings) else []
        table = "".join(f"<tr><td><code>{html.escape(k)}</code></td><td>{html.escape(str(v))}</td></tr>"
                        for k, v in rows + sorted(self.machine.items()))
        return f"<details><summary>{self.summary()}</summary><table>{table}</table></details>"

    def __str__(self) -> str:
        return f"{self.settings}\n{self.machine}"


def run_setup(settings) -> RunSetup:
    """The settings a lesson runs with and this machine's report, for the top of every lesson (folded)."""
    return RunSetup(settings, report())
