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
               "(FULL_SHARD ÷ NO_SHARD × N)", ratio, approx(1.0, rel=0.05), kind="measured", detail=True)
    ledger.note("fsdp1_rank0", {k: v for k, v in r0.items() if k != "dist"})
    shards = {name: d for name, d in r0.items() if name != "dist"}
    held = max(d[k] / shards["NO_SHARD"][k] for name, d in shards.items() if name != "NO_SHARD"
               for k in ("params", "grads"))
    table = "| rank 0, at rest | parameters (bytes) | gradients (bytes) |\n|---|---|---|\n" + "\n".join(
        f"| {name} | {d['params']:,} | {d['grads']:,} |" for name, d in shards.items())
    return Findings([f"The same shares: at rest on {len(f1)} ranks, SHARD_GRAD_OP and FULL_SHARD leave rank 0 "
                     f"**{held:.2f}** of NO_SHARD's parameters and gradients, $1/N$, as ZeRO-2 and ZeRO-3 do."],
                    [table])
