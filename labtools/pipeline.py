"""Pipeline schedules as data: which forward and backward each rank runs, in what order, and what that implies.

    order = schedule_order("1f1b", p=4, m=8)          # per rank: [Action("F", mb, stage), Action("B", ...), ...]
    iv = simulate(order, t_f=1, t_b=2)                 # a timeline: each action's start and end, dependencies kept
    idle_fraction(iv), in_flight(order)                # the bubble, and micro-batches held per rank

Schedules (written from the papers, for learning; torch.distributed.pipelining runs the real ones):
- "gpipe" (Huang et al. 2019): every forward, then every backward. Rank r holds all m micro-batches'
  activations at once.
- "1f1b" (PipeDream-Flush, Narayanan et al. 2021): min(m, p − r) forwards to fill the pipeline, then one
  backward and one forward alternately, then the remaining backwards — torch's Schedule1F1B order. The same
  bubble as GPipe, but rank r holds at most min(m, p − r) micro-batches.
- "interleaved" (Narayanan et al. 2021, §2.2): v chunks of layers per rank (stage r + k·p on rank r); forwards
  go chunk by chunk over groups of p micro-batches, so the fill takes 1/v as long: bubble (p−1)/(v·m + p−1).
  Needs m to be a multiple of p.

Zero-bubble schedules (Qi et al. 2024) split a backward B in two: I, the gradient of the stage's input (what the
stage before waits for), and W, the gradient of its weights (which nobody waits for, so it can fill a gap). The lab
does not write them out: `from_torch` reads the action list torch's ScheduleZBVZeroBubble runs, and `simulate`
plays it like any other order.

Pure Python, no torch.distributed: a widget can redraw a schedule in a millisecond. Stage s of p·v lives on
rank s mod p. Introduced in notebooks/09_pipeline_parallel.ipynb.
"""

import re
from dataclasses import dataclass

from labtools.keys import Key


class Schedule(Key):
    """Every pipeline schedule the lab names, defined once: the planner here, the stages in labtools.parallel.pipeline,
    the lessons' ranks and panels all use these. A str, so a schedule travels to ranks (and back) as its value."""
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"                # Interleaved1F1B: v chunks of layers per rank
    ZERO_BUBBLE = "zero-bubble"                # torch's InterleavedZeroBubble (backward split in input and weight)
    ZBV = "zbv"                                # torch's ZBVZeroBubble: two chunks per rank in a V
    WRITTEN_OUT_GPIPE = "written-out gpipe"    # GPipe over send/recv, written out for learning
    WRITTEN_OUT_1F1B = "written-out 1f1b"      # 1F1B over send/recv, written out for learning

    @property
    def chunked(self) -> bool:
        """Runs v > 1 chunks of layers per rank."""
        return self in (Schedule.INTERLEAVED, Schedule.ZERO_BUBBLE, Schedule.ZBV)

    @property
    def written_out(self) -> bool:
        return self.value.startswith("written-out")

    @property
    def order(self) -> "Schedule":
        """The schedule whose order of actions this one runs (a written-out one runs its namesake's)."""
        return Schedule(self.value.split()[-1])


SCHEDULES = (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)  # what schedule_order() writes out


@dataclass(frozen=True)
class Action:
    kind: str   # "F" forward, "B" backward (input and weight gradients together), or its halves "I" and "W"
    mb: int     # micro-batch
    stage: int  # pipeline stage (0 … p·v − 1)


def check_schedule(schedule: str, p: int, m: int, v: int = 1) -> None:
    """ValueError naming what is wrong: the schedule, p ≥ 2, m ≥ 1, v ≥ 1 (v > 1 only interleaved, m % p == 0)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {tuple(str(s) for s in SCHEDULES)}, got {schedule!r}")
    for name, value, lo in (("p (stages)", p, 2), ("m (micro-batches)", m, 1), ("v (chunks per rank)", v, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")
    if schedule == Schedule.INTERLEAVED:
        if v < 2:
            raise ValueError(f"the interleaved schedule needs v >= 2 chunks per rank, got v = {v}")
        if m % p:
            raise ValueError(f"the interleaved schedule needs m to be a multiple of p: m = {m}, p = {p}")
    elif v != 1:
        raise ValueError(f"v > 1 (chunks per rank) needs the interleaved schedule, got {schedule!r} with v = {v}")


def schedule_order(schedule: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Each rank's actions, in the order it runs them."""
    check_schedule(schedule, p, m, v)
    if schedule == Schedule.GPIPE:
        return [[Action("F", i, r) for i in range(m)] + [Action("B", i, r) for i in range(m)] for r in range(p)]
    if schedule == Schedule.ONE_F_ONE_B:
        out = []
        for r in range(p):
            warmup = min(m, p - r)
            order = [Action("F", i, r) for i in range(warmup)]
            for i in range(m - warmup):  # steady state: one backward, then one forward
                order += [Action("B", i, r), Action("F", warmup + i, r)]
            order += [Action("B", i, r) for i in range(m - warmup, m)]
            out.append(order)
        return out
    return [_interleaved(r, p, m, v) for r in range(p)]


def _interleaved(r: int, p: int, m: int, v: int) -> list[Action]:
    """Megatron-LM's interleaved 1F1B for rank r: micro-batches in groups of p, each group through chunk 0, then
    chunk 1, …; backwards in the same groups with the chunks reversed."""
    forwards = [Action("F", g + i, r + k * p) for g in range(0, m, p) for k in range(v) for i in range(p)]
    backwards = [Action("B", g + i, r + k * p) for g in range(0, m, p) for k in reversed(range(v)) for i in range(p)]
    total = m * v
    warmup = min(total, (p - r - 1) * 2 + (v - 1) * p)
    order = forwards[:warmup]
    for i in range(total - warmup):
        order += [forwards[warmup + i], backwards[i]]
    return order + backwards[total - warmup:]


KINDS = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}  # letter: timeline kind
LETTERS = {kind: letter for letter, kind in KINDS.items()}


def from_torch(actions: list) -> list[Action]:
    """One rank's compute actions from torch's pipeline_order (its _Action, or their strings "3F0": stage, kind,
    micro-batch); the empty slots (None) and anything but F, B, I and W are left out."""
    out = []
    for a in actions:
        hit = re.fullmatch(r"(\d+)([FBIW])(\d+)", str(a)) if a is not None else None
        if hit:
            out.append(Action(hit[2], int(hit[3]), int(hit[1])))
    return out


def split_backward(order: list[list[Action]]) -> list[list[Action]]:
    """The same order with each B split into I then W: the input's gradient goes to the stage before as soon as I
    ends, before this stage computes its weights' gradient."""
    return [[b for a in actions for b in ((Action("I", a.mb, a.stage), Action("W", a.mb, a.stage)) if a.kind == "B"
                                          else (a,))] for actions in order]


def simulate(order: list[list[Action]], t_f: float = 1.0, t_b: float = 2.0, v: int = 1,
             t_comm: float = 0.0, w_share: float = 0.5) -> list[dict]:
    """Run the schedule on an idealised machine: each rank executes its actions in order, an action starts when
    its rank is free and its input is ready (the forward of the stage before, or the input gradient of the stage
    after, plus t_comm), a chunk's forward takes t_f / v and its backward t_b / v — of which W, where the backward
    is split, takes the share w_share and I the rest. A W waits for its own I. Returns intervals {row (rank), kind,
    mb, stage, start, end, label}. Raises ValueError if the orders deadlock."""
    p = len(order)
    n_stages = p * v
    t = {"F": t_f / v, "B": t_b / v, "I": t_b * (1 - w_share) / v, "W": t_b * w_share / v}
    done: dict[tuple, float] = {}  # ("F" | "G" (the input's gradient, from B or I) | "W", mb, stage): end
    free = [0.0] * p
    nxt = [0] * p
    out = []
    remaining = sum(len(o) for o in order)
    while remaining:
        progressed = False
        for r in range(p):
            while nxt[r] < len(order[r]):
                a = order[r][nxt[r]]
                if a.kind == "F":
                    dep = ("F", a.mb, a.stage - 1) if a.stage > 0 else None
                elif a.kind == "W":
                    dep = ("G", a.mb, a.stage)
                else:
                    dep = ("G", a.mb, a.stage + 1) if a.stage < n_stages - 1 else ("F", a.mb, a.stage)
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep] + (t_comm if dep[2] != a.stage else 0.0)
                start = max(free[r], ready)
                end = free[r] = start + t[a.kind]
                done[("G" if a.kind in "BI" else a.kind, a.mb, a.stage)] = end
                out.append({"row": r, "kind": KINDS[a.kind], "mb": a.mb, "stage": a.stage, "start": start,
                            "end": end, "label": f"{a.kind}{a.mb}"})
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("the schedule deadlocks: some rank waits for an action that never runs")
    return out


def idle_fraction(intervals: list[dict], rows: int | None = None) -> float:
    """1 − busy / (ranks × span): the bubble of a timeline (span from the first start to the last end)."""
    rows = rows or len({iv["row"] for iv in intervals})
    span = max(iv["end"] for iv in intervals) - min(iv["start"] for iv in intervals)
    busy = sum(iv["end"] - iv["start"] for iv in intervals)
    return 1.0 - busy / (rows * span)


def idle_per_row(intervals: list[dict]) -> dict[int, float]:
    """Each rank's idle share of the common span."""
    span = max(iv["end"] for iv in intervals) - min(iv["start"] for iv in intervals)
    rows = sorted({iv["row"] for iv in intervals})
    return {r: 1.0 - sum(iv["end"] - iv["start"] for iv in intervals if iv["row"] == r) / span for r in rows}


def decompose(intervals: list[dict]) -> dict[str, float]:
    """Split a measured timeline's time (all ranks × the step's span) into busy, bubble and latency.

    For each action, the gap since the rank's previous action (or since the step began) is bubble as long as
    the action's input was still being computed elsewhere — the forward of the stage before, the input gradient
    (B or I) of the stage after — and latency after that: the input existed but had not arrived (messages, the
    schedule's own work, a core shared with other ranks). Time after a rank's last action is bubble (the drain).
    Needs one clock for all ranks. Returns fractions of ranks × span: busy, bubble, latency (they add up to 1).
    """
    rows = sorted({iv["row"] for iv in intervals})
    n_stages = max(iv["stage"] for iv in intervals) + 1
    t0, t1 = min(iv["start"] for iv in intervals), max(iv["end"] for iv in intervals)
    end = {("F" if iv["kind"] == "forward" else "G", iv["mb"], iv["stage"]): iv["end"] for iv in intervals
           if iv["kind"] != "backward_weight"}
    busy = bubble = latency = 0.0
    for r in rows:
        prev = t0
        for iv in sorted((iv for iv in intervals if iv["row"] == r), key=lambda iv: iv["start"]):
            if iv["kind"] == "forward":
                dep = end.get(("F", iv["mb"], iv["stage"] - 1), t0) if iv["stage"] > 0 else t0
            elif iv["kind"] == "backward_weight":
                dep = t0  # its own I, on this rank: never a bubble
            else:
                dep = end.get(("G", iv["mb"], iv["stage"] + 1), t0) if iv["stage"] < n_stages - 1 else t0
            gap = max(0.0, iv["start"] - prev)
            waiting = min(gap, max(0.0, dep - prev))
            bubble += waiting
            latency += gap - waiting
            busy += iv["end"] - iv["start"]
            prev = max(prev, iv["end"])
        bubble += t1 - prev
    total = len(rows) * (t1 - t0)
    return {"busy": busy / total, "bubble": bubble / total, "latency": latency / total}


def in_flight(order: list[list[Action]]) -> list[int]:
    """Per rank, the most micro-batch chunks forwarded but not yet backwarded at once (activations held; a split
    backward frees them at its W)."""
    peaks = []
    for actions in order:
        live = peak = 0
        for a in actions:
            live += {"F": 1, "I": 0}.get(a.kind, -1)
            peak = max(peak, live)
        peaks.append(peak)
    return peaks
