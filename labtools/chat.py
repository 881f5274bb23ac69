"""The addition task asked and answered in a chat template, and a base model that has read addition as plain text:
what the post-training lessons (20, 21) start from.

    base = pretrained(BaseRecipe())                  # a small GPT trained on "07+45=052" lines, kept on disk
    T = Template()                                   # the user's text, the assistant tag, the answer, the end tag
    T.prompt(problem)  -> "07+45▶"                   T.line(problem) -> "07+45▶052■"
    s = sample(model, prompts, max_new=4, temperature=1.0, generator=g, end=T.end)   # Samples: tokens and text
    grade(model, T, problems)                        # Graded: exact answers (then the end tag), Wilson's interval
    plain_skill(model, problems)                     # Graded: the same problems asked as plain text ("07+45=")

The base model reads addition as text (labtools.tasks's lines, a line break after each answer), one problem per row,
with the next-token loss on every character: it learns to add, as a model pre-trained on text picks up what the text
does, but it has never seen a chat template's tags. A template here writes its assistant tag where the plain text
has its equals sign, so that every digit keeps its position: the lab's GPT learns positions, not distances, and a
tag put in front of the question would move every digit (measured: after the same fine-tuning, 2-9% exact answers
with a tag in front, 90% with the tag in place of "=").

The base is cached under build/cache (LABTOOLS_CACHE overrides), keyed by its recipe and this module's version,
written atomically and read with torch.load(weights_only=True).
"""

import hashlib
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from labtools.model import GPT, GPTConfig
from labtools.progress import progress
from labtools.tasks import END, VOCAB as TEXT_VOCAB, Addition, Graded, Problem
from labtools.validate import check_range

VOCAB = TEXT_VOCAB + "▶■▷□"  # the plain text's characters, and the tags of two chat templates
STOI = {c: i for i, c in enumerate(VOCAB)}
CACHE_VERSION = 1  # bump when the base's training changes: a cached base of another version is not read
ROOT = Path(__file__).resolve().parents[1]


def encode(text: str) -> list[int]:
    unknown = sorted(set(text) - STOI.keys())
    if unknown:
        raise ValueError(f"characters outside the chat vocabulary: {unknown!r}")
    return [STOI[c] for c in text]


def decode(ids) -> str:
    return "".join(VOCAB[int(i)] for i in ids)


@dataclass(frozen=True)
class Template:
    """A chat template: the user's question, the assistant tag (where plain text has "="), the answer, the end tag."""
    assistant: str = "▶"
    end: str = "■"

    def __post_init__(self):
        for name in ("assistant", "end"):
            tag = getattr(self, name)
            if len(tag) != 1 or tag not in VOCAB or tag in "0123456789+":
                raise ValueError(f"Template.{name} must be one tag character of {VOCAB[12:]!r}, got {tag!r}")

    def prompt(self, p: Problem) -> str:
        return p.prompt[:-1] + self.assistant  # "07+45=" -> "07+45▶"

    def target(self, answer: str) -> str:
        return answer + self.end

    def line(self, p: Problem, answer: str | None = None) -> str:
        return self.prompt(p) + self.target(p.answer if answer is None else answer)

    def examples(self, problems: list[Problem], answers: list[str] | None = None, mask: bool = True):
        """(X, Y) one example per row: Y the next characters, IGNORE on the prompt's where mask (the loss then counts
        the answer and its end tag alone)."""
        answers = [p.answer for p in problems] if answers is None else answers
        ids = torch.tensor([encode(self.line(p, a)) for p, a in zip(problems, answers)])
        X, Y = ids[:, :-1], ids[:, 1:].clone()
        if mask:
            Y[:, :len(self.prompt(problems[0])) - 1] = IGNORE
        return X, Y


def no_carry(p: Problem) -> str:
    """The answer with every carry dropped: each digit the sum of its column, mod 10 ("17+25" -> "032"): a wrong
    answer a careless demonstrator writes."""
    a, b = p.prompt[:-1].split("+")
    return "0" + "".join(str((int(x) + int(y)) % 10) for x, y in zip(a, b))


def noisy_answers(problems: list[Problem], share: float, seed: int = 9) -> list[str]:
    """Each problem's answer, or (with probability `share`, drawn by seed) its answer without carries."""
    check_range("share", share, 0.0, 1.0)
    rng = random.Random(seed)
    return [no_carry(p) if rng.random() < share else p.answer for p in problems]


TEST_SHARE = 0.2  # of all problems, held out from the base's pre-training and from all post-training


def held_out(digits: int) -> int:
    """Problems of the task held out from the base and from all post-training."""
    return max(1, round((10 ** digits) ** 2 * TEST_SHARE))


def halves(r: "BaseRecipe", seed: int = 0) -> tuple[list[Problem], list[Problem], list[Problem]]:
    """The problems the base read, in two halves, the first shuffled by seed (demonstrations are drawn from it, the
    problems post-training samples on from the other), and the held-out test problems."""
    train, test = r.task.split(TEST_SHARE, seed=0)
    half = len(train) // 2
    first = list(train[:half])
    random.Random(seed).shuffle(first)
    return first, list(train[half:]), list(test)


IGNORE = -100  # a target no loss counts (labtools.packing's, cross_entropy's ignore_index)


@dataclass(frozen=True)
class BaseRecipe:
    """How the base model is pre-trained: a GPT of this shape, next-token loss on plain addition lines."""
    digits: int = 2
    n_layer: int = 2
    n_embd: int = 48
    n_head: int = 4
    steps: int = 500
    batch_size: int = 128
    lr: float = 6e-3
    seed: int = 0

    def __post_init__(self):
        check_range("steps", self.steps, 1, 1_000_000, int)
        check_range("batch_size", self.batch_size, 1, 100_000, int)

    @property
    def task(self) -> Addition:
        return Addition(self.digits)

    def key(self) -> str:
        text = json.dumps(asdict(self) | {"vocab": VOCAB, "version": CACHE_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def new_model(r: BaseRecipe, seed: int | None = None) -> GPT:
    torch.manual_seed(r.seed if seed is None else seed)
    longest = 2 * r.digits + 2 + r.digits + 1 + 1  # "07+45=052\n", or a template's line
    return GPT(GPTConfig(vocab_size=len(VOCAB), block_size=longest, n_layer=r.n_layer, n_head=r.n_head,
                         n_embd=r.n_embd))


def cache_dir() -> Path:
    return Path(os.environ.get("LABTOOLS_CACHE") or ROOT / "build" / "cache")


def pretrained(r: BaseRecipe, device: torch.device | str = "cpu") -> GPT:
    """The base model of this recipe: read from the cache, or pre-trained (with a progress bar) and kept there."""
    model = new_model(r)
    path = cache_dir() / f"chat-base-{r.key()}.pt"
    if path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.to(device)
    model = pretrain(model.to(device), r)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, tmp)
    tmp.replace(path)  # readers never see half a file
    return model


def pretrain(model: GPT, r: BaseRecipe) -> GPT:
    """Next-token training on the training problems written as plain lines, every character counted."""
    train, _ = r.task.split(TEST_SHARE, seed=0)
    device = next(model.parameters()).device
    ids = torch.tensor([encode(p.line) for p in train], device=device)  # "07+45=052\n" per row
    X, Y = ids[:, :-1], ids[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=r.lr, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(r.seed)
    for _ in progress(range(r.steps), desc="pre-training the base model"):
        idx = torch.randint(len(X), (r.batch_size,), generator=g).to(device)
        _, loss = model(X[idx], Y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


@dataclass(frozen=True)
class Samples:
    """Completions of prompts: tokens (N, max_new), mask (N, max_new) True up to and including the end tag (what
    the model said; what follows is not its answer), and each completion as text up to its end tag."""
    tokens: torch.Tensor
    mask: torch.Tensor
    text: list[str]
    end_id: int

    @property
    def truncated(self) -> torch.Tensor:
        """True where the completion never reached the end tag within max_new characters."""
        return ~(self.tokens == self.end_id).any(dim=1)


class KVCache:
    """Each block's keys and values of the positions seen so far: a new position's attention then reads them instead
    of recomputing every earlier position (written here for the lab's GPT: lesson 21 measures what it saves)."""

    def __init__(self, model: GPT):
        self.model = model
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * model.config.n_layer
        self.length = 0

    def step(self, idx: torch.Tensor) -> torch.Tensor:
        """The logits (B, V) after the new tokens idx (B, T): the whole prompt first, then one token at a time."""
        m, (B, T) = self.model, idx.shape
        if self.length + T > m.config.block_size:
            raise ValueError(f"sequence length {self.length + T} exceeds block_size {m.config.block_size}")
        pos = torch.arange(self.length, self.length + T, device=idx.device)
        x = m.transformer.wte(idx) + m.transformer.wpe(pos)
        for i, block in enumerate(m.transformer.h):
            a = block.attn
            qkv = a.c_attn(block.ln_1(x))
            q, k, v = qkv.view(B, T, -1, 3, a.head_size).permute(3, 0, 2, 1, 4).unbind(0)  # each (B, nh, T, hs)
            if self.kv[i] is not None:
                k, v = torch.cat([self.kv[i][0], k], dim=2), torch.cat([self.kv[i][1], v], dim=2)
            self.kv[i] = (k, v)
            # the prompt attends causally within itself; a new token attends every position before it, and itself
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.length == 0 and T > 1)
            x = x + a.c_proj(y.transpose(1, 2).reshape(B, T, -1))
            x = x + block.mlp(block.ln_2(x))
        self.length += T
        logits = m.lm_head(m.transformer.ln_f(x[:, -1]))
        return logits / m.config.width_mult if m.config.mup_base_width is not None else logits


@torch.no_grad()
def sample(model: GPT, prompts: list[str], max_new: int, temperature: float = 1.0,
           generator: torch.Generator | None = None, end: str = "■", cache: bool = True) -> Samples:
    """max_new characters after each prompt (prompts of one length): greedy at temperature 0, else drawn from the
    softmax at that temperature. cache: keep each block's keys and values (KVCache) instead of running the whole
    sequence again for each new character; the same answers either way."""
    check_range("temperature", temperature, 0.0, 100.0)
    check_range("max_new", max_new, 1, 10_000, int)
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("sample needs prompts of one length")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    x = torch.tensor([encode(p) for p in prompts], device=device)
    start = x.size(1)
    # a cache holds at most block_size positions; longer runs slide a window over the sequence instead
    kv = KVCache(model) if cache and start + max_new - 1 <= model.config.block_size else None
    for _ in range(max_new):
        if kv is not None:
            logits = kv.step(x if kv.length == 0 else x[:, -1:]).float()
        else:
            logits = model(x[:, -model.config.block_size:])[0][:, -1].float()
        if temperature == 0:
            nxt = logits.argmax(-1, keepdim=True)
        else:
            probs = torch.softmax(logits / temperature, -1).cpu()
            nxt = torch.multinomial(probs, 1, generator=generator).to(device)
        x = torch.cat([x, nxt], dim=1)
    model.train(was_training)
    tokens = x[:, start:]
    end_id = STOI[end]
    ended = (tokens == end_id).int().cumsum(1)
    mask = (ended - (tokens == end_id).int()) == 0  # up to and including the first end tag
    text = [decode(row[m]) for row, m in zip(tokens.cpu(), mask.cpu())]
    return Samples(tokens, mask, text, end_id)


def right(template: Template, problems: list[Problem], completions: list[str]) -> list[bool]:
    """The verifier: exactly the answer, then the template's end tag."""
    return [c == template.target(p.answer) for p, c in zip(problems, completions)]


def grade(model: GPT, template: Template, problems: list[Problem], confidence: float = 0.95,
          prompt_template: Template | None = None) -> Graded:
    """Exact match, greedy: the share of problems answered exactly and closed with the end tag, with Wilson's
    interval. prompt_template: ask in another template (a mismatch) and still grade against `template`."""
    from labtools.evidence import share
    if not problems:
        raise ValueError("grade needs at least one problem")
    asked = prompt_template or template
    n = len(problems[0].answer) + 1
    s = sample(model, [asked.prompt(p) for p in problems], n, temperature=0.0, end=template.end)
    ok = right(template, problems, s.text)
    return Graded(share(sum(ok), len(ok), confidence), s.text, ok)


def plain_skill(model: GPT, problems: list[Problem], confidence: float = 0.95) -> Graded:
    """Exact match in the plain text's own form ("07+45=" -> "052" and the line break), greedy, with Wilson's
    interval: what the base model learned from the text it read."""
    from labtools.evidence import share
    s = sample(model, [p.prompt for p in problems], len(problems[0].answer) + 1, temperature=0.0, end=END)
    ok = [c == p.answer + END for p, c in zip(problems, s.text)]
    return Graded(share(sum(ok), len(ok), confidence), s.text, ok)
