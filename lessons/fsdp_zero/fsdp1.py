"""Lesson 08, section 2: FSDP1's FULL_SHARD and SHARD_GRAD_OP hold the same shares."""

import dataclasses

from labtools.claims import Findings, Ledger, approx
from labtools.parallel import launch
from lessons.fsdp_zero import TIMEOUT_S, Settings, ranks
from lessons.fsdp_zero.ranks import Fsdp1, Fsdp1Result


def run(S: Settings, world: int = 2) -> list[Fsdp1Result]:
    return launch(ranks.fsdp1, world, S, desc=f"FSDP1 × {world}", timeout_s=TIMEOUT_S)


def findings(ledger: Ledger, f1: list[Fsdp1Result]) -> Findings:
    shards = f1[0].held
    whole = shards[Fsdp1.NO_SHARD]
    ratio = shards[Fsdp1.FULL_SHARD].params / whole.params * len(f1)
    ledger.add("fsdp1_full", "FSDP1 FULL_SHARD and SHARD_GRAD_OP hold 1/N of the parameters at rest, NO_SHARD all "
               "(FULL_SHARD ÷ NO_SHARD × N)", ratio, approx(1.0, rel=0.05), kind="measured", detail=True)
    ledger.note("fsdp1_rank0", {name: dataclasses.asdict(d) for name, d in shards.items()})
    held = max(max(d.params / whole.params, d.grads / whole.grads) for name, d in shards.items()
               if name is not Fsdp1.NO_SHARD)
    stage = {Fsdp1.NO_SHARD: "DDP", Fsdp1.SHARD_GRAD_OP: "ZeRO-2", Fsdp1.FULL_SHARD: "ZeRO-3"}
    table = "| rank 0, at rest | parameters (bytes) | gradients (bytes) |\n|---|---|---|\n" + "\n".join(
        f"| `{name}` ({stage[name]}) | {d.params:,} | {d.grads:,} |" for name, d in shards.items())
    return Findings([f"Yes: at rest, its ZeRO-2 and ZeRO-3 strategies leave rank 0 **{held:.2f}** of what it would "
                     f"hold unsharded ($1/N$ on {len(f1)} ranks), as FSDP2 does."], [table])
