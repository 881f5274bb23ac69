"""One package per notebook: notebooks/NN_<topic>.ipynb ↔ lessons/<topic>/.

A lesson is born in this shape (lessons/data_parallel/ is a complete example):

    lessons/<topic>/
        __init__.py    Settings(LabConfig) + PROFILES + settings(); no plotly, ipywidgets or IPython (ranks import it)
        <section>.py   one per notebook section: run(S) -> results, figure(results), findings(ledger, results)
        playground.py  the section's panel, when it has one of its own
        *_exercise.py  your turn: check(fn) with labtools.exercises, show_solution(), solution_source()
        ranks.py       what runs inside torchrun ranks: torch and core labtools only

The notebook follows the learner's shape that tests/test_prose.py checks (list the lesson in its FRAMED):
objectives, prerequisites, time and notation at the top; each section a question, the experiment, the result as
bullets; key takeaways, the ledger and "try next" at the end. The browser test does the exercise with its
solution (list the lesson in EXERCISES, tests/test_browser.py). Lessons 00, 02 and 07 are the examples.

__init__.py, the settings (labtools.config says how profiles and overrides resolve):

    from dataclasses import dataclass
    from labtools.config import LabConfig, resolve
    from labtools.validate import check_range

    @dataclass(frozen=True, kw_only=True)
    class Settings(LabConfig):          # profile, n_layer, n_embd, n_head, block_size, batch_size, steps, lr, seed
        accum_k: int = 4                # micro-batches per step
        RANGES = {"ACCUM_K": (2, 64)}   # checked by LabConfig: a ValueError naming the notebook's parameter

        def __post_init__(self):        # only what a range cannot say
            super().__post_init__()
            check_range("ACCUM_K", self.accum_k, 2, self.batch_size, int)

    PROFILES = {"smoke": Settings(profile="smoke", steps=15), "cpu": Settings(profile="cpu", steps=60),
                "gpu": Settings(profile="gpu", n_layer=6, n_embd=384, steps=200)}

    def settings(profile: str = "auto", **overrides) -> Settings:
        return resolve(PROFILES, profile, **overrides)

ranks.py, a rank function takes the settings themselves (rebuilt from JSON in every rank) and returns a dict:

    from labtools.parallel.toolkit import build_gpt, global_batch, rank_rows, train_step, world_size
    from lessons.<topic> import Settings

    def accumulation(S: Settings) -> dict:
        model = DDP(build_gpt(S))
        ...

<section>.py, the experiment, its figure and its findings:

    def run(S: Settings) -> list[dict]:
        return launch(ranks.accumulation, 2, S)                  # or train in this process

    def figure(results) -> go.Figure:                            # plots only (labtools.plots)
        ...

    def findings(ledger: Ledger, results) -> Findings:
        ratio = ...                                              # each number computed once
        ledger.add("no_sync_saves", "Without no_sync() DDP all-reduces k× as often", ratio, approx(k),
                   kind="measured")                              # measured | counted | computed
        return Findings([f"Without `no_sync()`: **{ratio:.0f}×** the all-reduces."])   # result first, one a bullet

A rank whose config is not the lesson's (a different step count, a directory) takes a smaller LabConfig
subclass made with labtools.config.derive(Job, S, steps=...), never a field-by-field copy.

The notebook imports the package and its sections (`from lessons import <topic> as lesson`, `from
lessons.<topic> import accumulation`), creates the ledger after the settings, calls `accumulation.run(S)`,
`accumulation.figure(...)`, `display(accumulation.findings(ledger, ...))`, and ends with `ledger.show()`.
Explanation that does not depend on the run is markdown in the notebook, where an author edits it.
"""
