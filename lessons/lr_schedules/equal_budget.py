"""Lesson 02, section 2: the schedules trained on an equal budget of steps."""

from dataclasses import replace

import plotly.graph_objects as go

from labtools import evidence, plots
from labtools.claims import Findings, Ledger, above, approx, at_least, at_most, in_words
from labtools.schedules import bind, warmup_cosine
from labtools.train import History, branches
from lessons.lr_schedules import Settings, train_run
from lessons.lr_schedules.designer import schedule_set
from lessons.lr_schedules.warmup import moderate_share

_COSINE_RUNS: dict[tuple, History] = {}


def cosine_run(S: Settings, total: int, warmup: int) -> History:
    """Warmup + cosine to 10% at the peak lr over `total` steps, trained once per (settings, total, warmup): section
    2's cosine run and section 4's cosine baseline at the same length are the same run (with the profiles' budget
    equal to the horizon), so the second asks for the first's history instead of training it again."""
    key = (S, total, warmup)
    if key not in _COSINE_RUNS:
        schedule = bind(warmup_cosine, warmup=warmup, total=total, min_ratio=0.1)
        _COSINE_RUNS[key] = train_run(S, schedule, total, S.peak_lr, desc=f"cosine {total}")
    return _COSINE_RUNS[key]


def run(S: Settings) -> dict[str, History]:
    """The four schedules, same model, data, peak lr and number of steps (10% warmup, floor 10%, WSD 70% stable).

    Constant and WSD are the same run until WSD's decay starts: it is trained once, saved there (labtools.train's
    checkpoint: weights, optimizer state, data position, history) and continued twice, each bit for bit what a
    run from scratch gives."""
    schedules = schedule_set(S.budget, 0.1, 0.1, 0.7 / 0.9, "cosine")
    warmup = schedules["cosine"].keywords["warmup"]
    constant, wsd_name = "constant (after warmup)", next(name for name in schedules if name.startswith("WSD"))
    fork = warmup + schedules[wsd_name].keywords["stable"]  # the first step at which the two can differ
    runs = {"cosine": cosine_run(S, S.budget, warmup),
            "linear": train_run(S, schedules["linear"], S.budget, S.peak_lr, desc="linear")}

    def part(name, desc):
        return lambda kw: train_run(S, schedules[name], S.budget, S.peak_lr, desc=desc, **kw)

    runs[constant], runs[wsd_name] = branches(fork, part(constant, "constant = WSD until its decay"),
                                              part(constant, constant), part(wsd_name, wsd_name))
    return {name: runs[name] for name in schedules}


CONSTANT = "constant (after warmup)"


def over_seeds(S: Settings, runs: dict[str, History]) -> tuple[list[float], list[float]] | None:
    """(constant's final losses, cosine's), run for run over S.seeds seeds (this run's first), or None for one seed:
    the same model initialisation and data order for both at each seed."""
    if S.seeds < 2:
        return None
    constant, cosine = [runs[CONSTANT].final_val_loss], [runs["cosine"].final_val_loss]
    schedules = schedule_set(S.budget, 0.1, 0.1, 0.7 / 0.9, "cosine")
    warmup = schedules["cosine"].keywords["warmup"]
    for k in range(1, S.seeds):
        other = replace(S, seed=S.seed + k)
        constant.append(train_run(other, schedules[CONSTANT], S.budget, S.peak_lr,
                                  desc=f"constant, seed {other.seed}").final_val_loss)
        cosine.append(cosine_run(other, S.budget, warmup).final_val_loss)
    return constant, cosine


def finals_figure(runs: dict[str, History], title: str) -> go.Figure:
    names = list(runs)
    fig = plots.bars(names, {"final val loss": [runs[n].final_val_loss for n in names]}, title=title,
                     yaxis="val loss")
    lo = min(runs[n].final_val_loss for n in names)
    fig.update_yaxes(range=[lo - 0.1, max(runs[n].final_val_loss for n in names) + 0.05])
    fig.update_traces(texttemplate="%{y:.3f}")
    return fig


def findings(ledger: Ledger, S: Settings, runs: dict[str, History],
             seeds: tuple[list[float], list[float]] | None = None) -> Findings:
    f = {n: h.final_val_loss for n, h in runs.items()}
    const = f[CONSTANT]
    decaying = {n: v for n, v in f.items() if n != CONSTANT}
    gain = const - max(decaying.values())  # constant − the worst decaying schedule
    spread = max(f.values()) - min(f.values())
    paired = evidence.paired(*seeds) if seeds else None  # constant − cosine, seed by seed (lesson 18)
    if paired is not None:
        ledger.add("decay_beats_constant", f"Equal budget ({S.budget} steps): cosine's decay ends below constant, "
                   f"over {paired.n} seeds paired (constant − cosine, nats)", paired, above(0.0), kind="measured")
    elif S.decay_margin is not None:
        ledger.add("decay_beats_constant", f"Equal budget ({S.budget} steps): every decaying schedule ends at least "
                   f"{S.decay_margin:g} nats below constant (constant − worst decaying; one seed)", gain,
                   at_least(S.decay_margin), kind="measured")
    else:  # in the smoke profile's 180 steps the sign of this difference changes from seed to seed
        ledger.note("decay_gain_over_constant", gain)
    ledger.add("decays_agree", f"Equal budget ({S.budget} steps): cosine, linear and WSD end within "
               f"{S.agree_within:g} nats of each other (max − min)",
               max(decaying.values()) - min(decaying.values()), at_most(S.agree_within), kind="measured")
    ledger.note("budget_final_val", f)
    mid = {shape: moderate_share(shape) for shape in ("cosine", "linear")}
    ledger.add("cosine_moderate", "\"Cosine spends more time at moderate learning rates than linear\" is backwards: "
               "cosine spends 1/3 of its decay in the middle half of the range, linear 1/2 (cosine's share ÷ "
               "linear's)", mid["cosine"] / mid["linear"], approx(2 / 3, rel=0.01),
               source="a widely repeated statement", kind="computed")
    if paired is not None:
        answer = (f"{'Yes' if paired.low > 0 else 'Not clearly'}: over {in_words(paired.n)} seeds cosine ends "
                  f"**{paired.estimate:.3f}** nats below constant on average, its interval, paired by seed, "
                  f"{'clear of zero' if paired.low > 0 else 'reaching zero'} (lesson 18). The three decays end close "
                  "together: *that* the rate comes down matters more than the shape.")
    elif S.decay_margin is None:
        answer = (f"In {S.budget} steps the four schedules end within **{spread:.2f}** nats of each other, a gap "
                  "whose sign changes with the seed: a run this short cannot say whether decaying helps. The `cpu` "
                  "profile's longer runs, over several seeds, can.")
    else:
        answer = (f"Yes: every decaying schedule ends at least **{gain:.2f}** nats below constant, and the three "
                  "decays end close together: *that* the rate comes down matters more than the shape.")
    table = "| schedule | final validation loss |\n|---|---|\n" + "\n".join(
        f"| {n} | {v:.3f} |" for n, v in f.items())
    return Findings([
        answer,
        "Cosine spends a third of its decay in the middle half of the range and linear half of it: the widely "
        "repeated statement is backwards (computed from the schedules).",
    ], [table, f"Peak learning rate {S.peak_lr:g}, {S.budget} steps, the same data order for every run."]
       + ([evidence.table([("constant − cosine, paired by seed", paired)])] if paired else []))
