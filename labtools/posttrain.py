"""Post-training on a verifiable task: supervised fine-tuning with the loss on the answer, preferences (DPO), and
reinforcement learning with the task's verifier (GRPO). Lessons 20 and 21; each loss also exists as a learner's
exercise, and the loops take the learner's function in place of the lab's.

    finetune(model, X, Y, steps=100)                       # SFT: FineTune (the loss of every step)
    dpo(policy, template, pairs, steps=60, beta=0.5)       # Preferences: DPORun (margins, the chosen's log-prob)
    grpo(policy, template, problems, steps=60, group=8)    # RL: GRPORun (reward, KL, clipped share per step)

References: supervised fine-tuning with the loss masked to the response (Ouyang et al. 2022, InstructGPT); DPO,
Rafailov et al. 2023, eq. 7; GRPO, Shao et al. 2024 (DeepSeekMath), section 4.1: group-relative advantages, the
clipped ratio of PPO (Schulman et al. 2017) and a KL penalty to the reference model estimated per token as
π_ref/π − log(π_ref/π) − 1.
"""

import copy
import random
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from labtools.chat import IGNORE, Template, encode, right, sample
from labtools.progress import check_cancelled, progress
from labtools.tasks import Problem
from labtools.validate import check_range


# --- the losses (the lab's references) ----------------------------------------------------------------------------

def sft_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the targets that count (not IGNORE): logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE)


def dpo_loss(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta: float) -> torch.Tensor:
    """DPO's loss, mean over pairs: −log σ(β[(log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))]), each
    argument (N,) a sequence's summed log-probability."""
    margin = beta * ((pi_chosen - ref_chosen) - (pi_rejected - ref_rejected))
    return -F.logsigmoid(margin).mean()


def group_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """rewards (P, G): G answers to each of P prompts. Each answer's reward minus its group's mean, divided by the
    group's standard deviation (+ eps: a group whose answers all scored alike gets 0, not 0/0)."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


# --- log-probabilities of answers ----------------------------------------------------------------------------------

def answer_logprobs(model, prompts: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """Per-token log-probabilities (N, A) of the answer tokens (N, A) after the prompts (N, P)."""
    ids = torch.cat([prompts, answers], dim=1)
    logits = model(ids[:, :-1])[0].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return logp[:, prompts.size(1) - 1:]


def _ids(texts: list[str], device) -> torch.Tensor:
    return torch.tensor([encode(t) for t in texts], device=device)


@torch.no_grad()
def sampled_kl(policy, ref, template: Template, problems: list[Problem], *, generator: torch.Generator,
               temperature: float = 1.0) -> float:
    """KL(π ‖ π_ref) per answer, nats: answers sampled from the policy, the mean over them of
    log π(answer) − log π_ref(answer), each summed over the answer's characters up to its end tag (a Monte Carlo
    estimate; never negative in expectation)."""
    n = len(problems[0].answer) + 1
    device = next(policy.parameters()).device
    prompts = [template.prompt(p) for p in problems]
    s = sample(policy, prompts, n, temperature, generator, end=template.end)
    P = _ids(prompts, device)
    gap = answer_logprobs(policy, P, s.tokens) - answer_logprobs(ref, P, s.tokens)
    return ((gap * s.mask).sum(1)).mean().item()


# --- supervised fine-tuning --------------------------------------------------------------------------------------

@dataclass
class FineTune:
    loss: list[float] = field(default_factory=list)  # the loss of each step, as the loss function gave it


def finetune(model, X: torch.Tensor, Y: torch.Tensor, *, steps: int, lr: float = 1e-3, batch_size: int = 64,
             seed: int = 0, loss_fn=sft_loss, desc: str = "fine-tuning") -> FineTune:
    """Fine-tune model in place on the examples (X, Y): AdamW, `steps` batches drawn with a seeded generator,
    loss_fn(logits, targets) (yours, in lesson 20)."""
    check_range("steps", steps, 1, 1_000_000, int)
    device = next(model.parameters()).device
    X, Y = X.to(device), Y.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    out = FineTune()
    model.train()
    for _ in progress(range(steps), desc=desc):
        check_cancelled()
        idx = torch.randint(len(X), (batch_size,), generator=g).to(device)
        logits, _ = model(X[idx])
        loss = loss_fn(logits, Y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out.loss.append(loss.item())
    return out


# --- preferences (DPO) ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    problem: Problem
    chosen: str      # a completion the verifier accepts
    rejected: str    # one it refuses, to the same prompt


def preference_pairs(model, template: Template, problems: list[Problem], *, answers: int = 4,
                     temperature: float = 1.0, seed: int = 0) -> list[Pair]:
    """Sample `answers` completions of each problem; where the verifier accepts one and refuses another, a pair."""
    n = len(problems[0].answer) + 1
    prompts = [template.prompt(p) for p in problems for _ in range(answers)]
    s = sample(model, prompts, n, temperature, torch.Generator().manual_seed(seed), end=template.end)
    pairs = []
    for i, p in enumerate(problems):
        texts = s.text[i * answers:(i + 1) * answers]
        ok = right(template, [p] * answers, texts)
        good = [t for t, r in zip(texts, ok) if r and len(t) == n]
        bad = [t for t, r in zip(texts, ok) if not r and len(t) == n]  # whole answers: one length per batch
        if good and bad:
            pairs.append(Pair(p, good[0], bad[0]))
    return pairs


@dataclass
class DPORun:
    loss: list[float] = field(default_factory=list)
    margin: list[float] = field(default_factory=list)          # β × the implicit reward margin, mean over the batch
    chosen_change: list[float] = field(default_factory=list)   # log π(y_w) − log π_ref(y_w), nats, mean


def dpo(policy, template: Template, pairs: list[Pair], *, steps: int, beta: float, lr: float = 1e-4,
        batch_size: int = 64, seed: int = 0, loss_fn=dpo_loss, desc: str = "DPO") -> DPORun:
    """Train policy in place on the pairs with loss_fn (yours, in lesson 20); the reference is policy as given."""
    check_range("beta", beta, 0.0, 100.0, open_lo=True)
    if not pairs:
        raise ValueError("dpo needs at least one pair: every sampled answer was right, or every one wrong")
    device = next(policy.parameters()).device
    ref = copy.deepcopy(policy).eval()
    P = _ids([template.prompt(x.problem) for x in pairs], device)
    W, L = _ids([x.chosen for x in pairs], device), _ids([x.rejected for x in pairs], device)
    with torch.no_grad():
        ref_w, ref_l = answer_logprobs(ref, P, W).sum(1), answer_logprobs(ref, P, L).sum(1)
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    out = DPORun()
    policy.train()
    for _ in progress(range(steps), desc=desc):
        check_cancelled()
        idx = torch.randint(len(pairs), (batch_size,), generator=g).to(device)
        pw, pl = answer_logprobs(policy, P[idx], W[idx]).sum(1), answer_logprobs(policy, P[idx], L[idx]).sum(1)
        loss = loss_fn(pw, pl, ref_w[idx], ref_l[idx], beta)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out.loss.append(loss.item())
        out.margin.append((beta * ((pw - ref_w[idx]) - (pl - ref_l[idx]))).mean().item())
        out.chosen_change.append((pw - ref_w[idx]).mean().item())
    return out


# --- reinforcement learning with the verifier (GRPO) ---------------------------------------------------------------

@dataclass
class GRPORun:
    reward: list[float] = field(default_factory=list)     # mean reward of each step's sampled answers
    signal: list[float] = field(default_factory=list)     # share of groups whose answers did not all score alike
    kl: list[float] = field(default_factory=list)         # per-token KL to the reference, mean over answer tokens
    clipped: list[float] = field(default_factory=list)    # share of answer tokens whose ratio the clip held
    truncated: list[float] = field(default_factory=list)  # share of answers that never reached the end tag
    sampling_s: float = 0.0  # seconds spent sampling the groups, all steps together
    seconds: float = 0.0     # seconds of the whole run


def grpo(policy, template: Template, problems: list[Problem], *, steps: int, prompts: int = 16, group: int = 8,
         temperature: float = 1.0, clip: float = 0.2, kl_weight: float = 0.04, lr: float = 1e-4, epochs: int = 2,
         max_new: int | None = None, seed: int = 0, advantages_fn=group_advantages, ask=None, cache: bool = True,
         desc: str = "GRPO") -> GRPORun:
    """Each step: `prompts` problems, `group` answers sampled to each at `temperature` (asked as ask(problem)
    writes them, the template's prompt by default), rewarded 1 if the verifier accepts them; advantages_fn(rewards
    (P, G)) (yours, in lesson 21); then `epochs` updates of the clipped objective minus kl_weight × KL to the policy
    as given. cache: sample with a KV cache. Trains policy in place."""
    check_range("group", group, 2, 1024, int)
    check_range("temperature", temperature, 0.0, 100.0, open_lo=True)
    check_range("kl_weight", kl_weight, 0.0, 100.0)
    n = len(problems[0].answer) + 1
    max_new = n if max_new is None else max_new
    check_range("max_new", max_new, 1, 64, int)
    ask = ask or template.prompt
    device = next(policy.parameters()).device
    ref = copy.deepcopy(policy).eval()
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    g, pick = torch.Generator().manual_seed(seed), random.Random(seed)
    out = GRPORun()
    start = time.perf_counter()
    for _ in progress(range(steps), desc=desc):
        check_cancelled()
        batch = pick.sample(problems, prompts)
        asked = [ask(p) for p in batch for _ in range(group)]
        t0 = time.perf_counter()
        s = sample(policy, asked, max_new, temperature, g, end=template.end, cache=cache)
        out.sampling_s += time.perf_counter() - t0
        r = torch.tensor(right(template, [p for p in batch for _ in range(group)], s.text), dtype=torch.float32)
        rewards = r.view(prompts, group)
        adv = advantages_fn(rewards).reshape(-1, 1).to(device)
        P, A, mask = _ids(asked, device), s.tokens, s.mask.float()
        with torch.no_grad():
            old, ref_lp = answer_logprobs(policy, P, A), answer_logprobs(ref, P, A)
        policy.train()
        for _ in range(epochs):
            new = answer_logprobs(policy, P, A)
            ratio = (new - old).exp()
            objective = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
            kl = (ref_lp - new).exp() - (ref_lp - new) - 1
            loss = -((objective - kl_weight * kl) * mask).sum() / mask.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        out.reward.append(r.mean().item())
        out.signal.append((rewards.std(dim=1) > 0).float().mean().item())
        out.kl.append(((kl * mask).sum() / mask.sum()).item())
        out.clipped.append(((((ratio - 1).abs() > clip).float() * mask).sum() / mask.sum()).item())
        out.truncated.append(s.truncated.float().mean().item())
    out.seconds = time.perf_counter() - start
    return out
