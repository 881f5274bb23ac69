"""One module per lesson: the experiments a notebook runs, their figures, and the claims they settle.

A new lesson follows one shape (lessons/data_parallel.py is a full example):

    @dataclass(frozen=True)
    class Settings:                 # every knob of the notebook's parameters cell, validated in __post_init__
        profile: str                # (labtools.profiles.check_range: a ValueError naming the parameter)
        steps: int
        ...
    PROFILES = {"smoke": Settings(...), "cpu": Settings(...), "gpu": Settings(...)}
    def settings(profile="auto", **overrides) -> Settings: return resolve(PROFILES, profile, **overrides)

    # --- one block per notebook section ---
    def run_<section>(S) -> results             # the experiment (a launch of lessons/ranks/<lesson>.py, or training)
    def <section>_figure(results) -> go.Figure  # plots only (labtools.plots.style / subplots / timeline)
    def <section>_findings(ledger, [S,] results) -> str
        # the section's statistics, computed once; ledger.add(..., kind=...) for every number the prose states,
        # kind "measured", "counted" or "computed" (labtools.claims.KINDS); returns the markdown summary

The notebook creates the ledger right after the settings (`ledger = Ledger("NN_topic")`), each section cell
ends with `display(Markdown(lesson.<section>_findings(ledger, ...)))`, and the last cell is `ledger.show()`.
Rank functions live in lessons/ranks/<lesson>.py and import torch and core labtools only.
"""
