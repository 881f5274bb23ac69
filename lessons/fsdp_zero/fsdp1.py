"""Lesson 08, section 2: FSDP1's FULL_SHARD and SHARD_GRAD_OP hold the same shares."""

from labtools.claims import Findings, Ledger, approx
from labtools.parallel import launch
from lessons.fsdp_zero import TIMEOUT_S, Settings, ranks


def run(S: Settings, world: int = 2) -> list[dict]:
    return launch(ranks.fsdp1, world, S, desc=f"FSDP1 × {world}", timeout_s=TIMEOUT_S)


def findings(ledger: Ledger, f1: list[dict]) -> Findings:
    r0 = f1[0]
    ratio = r0["FULL_SHARD"]["params"] / r0["NO_SHARD"]["params"] * len(f1)
    ledger.add("fsdp1_full", "FSDP1 FULL_SHARD and SHARD_GRAD_OP hold 1/N of the parameters at rest, NO_SHARD all "
               "(FULL_SHARD ÷ NO_SHARD × N)", ratio, approx(1.0, rel=0.05), kind="measured")
    ledger.note("fsdp1_rank0", {k: v for k, v in r0.items() if k != "dist"})
    return Findings([f"Rank 0, **{name}**: parameters {d['params']:,} bytes, gradients {d['grads']:,}."
                     for name, d in r0.items() if name != "dist"])
