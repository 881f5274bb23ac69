"""A device mesh for dp × tp (× pp) on the ranks of a launch: which ranks share which parallel dimension.

    mesh = make_mesh(dp=2, tp=2)      # 4 ranks: mesh["dp"], mesh["tp"] are the 1-D sub-meshes
    apply_tensor_parallel(model, mesh["tp"]); fully_shard(block, mesh=mesh["dp"])

Ranks are laid out with tp innermost (ranks 0, 1 are one tensor-parallel group), as on real clusters where a
tensor-parallel group stays inside a node's fast links; then dp, then pp outermost.
Introduced in notebooks/10_tensor_parallel.ipynb.
"""

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from labtools.parallel.toolkit import device


def check_mesh(dp: int, tp: int, pp: int, world: int) -> None:
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if dp * tp * pp != world:
        raise ValueError(f"dp · tp · pp must equal the world size: {dp} · {tp} · {pp} = {dp * tp * pp} != {world}")


def make_mesh(dp: int = 1, tp: int = 1, pp: int = 1) -> DeviceMesh:
    """The (pp, dp, tp) mesh over this launch's ranks, dimensions of size 1 dropped (names "pp", "dp", "tp")."""
    check_mesh(dp, tp, pp, dist.get_world_size())
    dims = [(n, s) for n, s in (("pp", pp), ("dp", dp), ("tp", tp)) if s > 1] or [("dp", 1)]
    return init_device_mesh(device().type, tuple(s for _, s in dims), mesh_dim_names=tuple(n for n, _ in dims))
