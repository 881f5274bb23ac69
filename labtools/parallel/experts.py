"""Expert parallelism: a mixture of experts' layer with its experts spread over the ranks of a group, tokens sent
to their experts' ranks and back with all-to-all (lesson 15 runs it on its own; labtools.parallel.nd inside the
GPT).

    y = expert_parallel_forward(x, moe, expert=lambda e: moe.experts[e], group=ep_group, counter={})

Rank r of the N in the group holds experts [r·E/N, (r+1)·E/N). Each rank routes its own tokens (capacity from its
own token count), tells every rank how many tokens it will send to each of its experts, sends them (all-to-all),
runs its local experts, and sends the results back (all-to-all again); the gates combine them where the tokens
live. torch.distributed.nn's all_to_all_single carries the gradients back the same way.
"""

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn

from labtools.moe import MoEMLP, capacity, dispatch


def expert_parallel_forward(x: torch.Tensor, m: MoEMLP, expert, group=None, counter: dict | None = None):
    """The MoE layer m on this rank's tokens x (T, C), its experts on the ranks of `group`; expert(e) is global
    expert e's module, asked only for this rank's. counter["forward"]: the bytes this rank handed the all-to-alls for
    other ranks, there and back (its own rows stay in place); counter["kept"]: assignments kept within capacity."""
    N, r, E = dist.get_world_size(group), dist.get_rank(group), m.n_experts
    local = E // N
    routing = m.route(m.router(x), m.top_k, capacity(x.size(0), E, m.top_k, m.capacity_factor))
    token, gate, counts = dispatch(routing)                      # kept assignments, grouped by expert
    send = counts.view(N, local)                                 # per destination rank, per its local expert
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send.contiguous(), group=group)  # how many tokens each rank sends me, per expert
    send_rows, recv_rows = send.sum(1).tolist(), recv.sum(1).tolist()
    x_send = x[token]
    x_recv = dnn.all_to_all_single(x.new_empty(sum(recv_rows), x.size(1)), x_send, recv_rows, send_rows, group)
    pieces, start = [], 0  # x_recv: for each source rank in turn, its tokens for my experts, grouped by expert
    for src in range(N):
        for e in range(local):
            n = int(recv[src, e])
            pieces.append(expert(r * local + e)(x_recv[start:start + n]))
            start += n
    y_recv = torch.cat(pieces) if pieces else x_recv
    y_send = dnn.all_to_all_single(x.new_empty(x_send.shape), y_recv, send_rows, recv_rows, group)
    if counter is not None:
        counter["forward"] = 2 * (x_send.numel() - send_rows[r] * x.size(1)) * x.element_size()  # there and back
        counter["kept"] = int(token.numel())
    m.routing = routing
    return torch.zeros_like(x).index_add(0, token, y_send * gate[:, None])
