"""Lesson 11, section 7: exercises, checked."""

from labtools.checkpoint import waste, young_interval
from labtools.claims import Ledger
from labtools.quiz import Question, answer_check
from lessons.fault_tolerance import HOUR


def exercises(ledger: Ledger) -> list[Question]:
    interval = young_interval(60.0, 6 * HOUR)
    w = sum(waste(interval, 60.0, 6 * HOUR).values())
    lost_steps = 137 % 50
    ledger.note("exercise_interval_min", interval / 60)

    return [
        Question("The interval", "A save stalls training for 60 s and the cluster fails every 6 h on average. How "
                 "often should you save (minutes), and what share of the run is wasted (%), restart left out?",
                 {"minutes": "interval (min)", "percent": "waste (%)"},
                 answer_check({"minutes": interval / 60, "percent": 100 * w}, rel=0.02),
                 f"$\\Delta^\\ast = \\sqrt{{2 \\cdot 60 \\cdot 21600}}$ s = **{interval / 60:.1f} min**; the waste "
                 f"$\\delta/\\Delta + \\Delta/(2\\,\\text{{MTBF}})$ = **{100 * w:.2f}%** (the two halves are equal at "
                 "the optimum)."),
        Question("Redone work", "Checkpoints every 50 steps, the first at step 50. A rank dies during step 137. How "
                 "many steps are computed twice?", {"steps": "steps"}, answer_check({"steps": lost_steps}, rel=0.02),
                 f"The newest checkpoint is step 100 (saved after 100 steps); steps 100–136 ran and are lost: "
                 f"**{lost_steps}**. A kill in the middle of the save of step 150 would lose 50 — and with the "
                 "tutorial recipe's in-place save, everything."),
    ]
