"""Graded check of chapter 12 (capstone), listed in :mod:`helpers.grading`.

The learner writes ``steps_in_budget(step_ms, budget_s, first_step_ms) -> int``: the largest number
of training steps n with first_step_ms + (n - 1) * step_ms <= 1000 * budget_s (the first step holds
the compile; every later step costs the measured median), 0 when the first step alone takes longer
than the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from helpers.grading.common import as_number, passed, reread

SECTIONS = {
    "ch12_steps_in_budget": (
        "chapter 12, section 3 (Train the fastest configuration for a fixed time)"
    ),
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


# (step_ms, budget_s, first_step_ms); the expected answers come from the formula in the docstring.
BUDGET_CASES = [
    (50.0, 10.0, 5050.0),
    (33.745, 100.0, 1475.2),
    (120.0, 60.0, 30000.0),
    (40.0, 2.0, 40.0),
    (29.148, 20.0, 25289.0),  # the first step alone is longer than the budget: no step fits
]


def _want(step_ms: float, budget_s: float, first_step_ms: float) -> int:
    return max(0, math.floor((1000.0 * budget_s - first_step_ms) / step_ms) + 1)


def check_steps_in_budget(fn: Callable[[float, float, float], int]) -> None:
    """Check ``steps_in_budget(step_ms, budget_s, first_step_ms) -> int`` on four budgets.

    Raises:
        AssertionError: a one-line message with a hint.
    """

    gid = "ch12_steps_in_budget"
    hint = _reread(gid)
    for step_ms, budget_s, first in BUDGET_CASES:
        call = f"steps_in_budget({step_ms}, {budget_s}, {first})"
        got, want = (
            as_number(fn(step_ms, budget_s, first), call, _reread(gid)),
            _want(step_ms, budget_s, first),
        )
        if got == want:
            continue
        if got == math.floor(1000.0 * budget_s / step_ms) and first > step_ms:
            why = (
                f"{call} returned {got:g}: the first step costs {first:g} ms, not {step_ms:g}; "
                "take its extra cost out of the budget."
            )
        elif got < 0:
            why = (
                f"{call} returned {got:g}: the first step alone takes longer than the budget, so "
                "no step fits: return 0, never a negative count."
            )
        elif got == want - 1:
            why = (
                f"{call} returned {got:g}, one too few: "
                "the first step is one of the steps, so count it."
            )
        elif got < 1:
            why = (
                f"{call} returned {got:g}: "
                "the budget is in seconds and the step times in milliseconds."
            )
        else:
            why = (
                f"{call} returned {got:g}, expected {want}: round down, a step that does not fit "
                "the budget is not run."
            )
        raise AssertionError(f"{why} {hint}")
    passed(
        gid,
        f"steps_in_budget is right for {len(BUDGET_CASES)} budgets, "
        "compile-heavy first steps included",
    )


def _ignores_first_step(step_ms, budget_s, first_step_ms):
    return math.floor(1000.0 * budget_s / step_ms)


def _forgets_first_step_counts(step_ms, budget_s, first_step_ms):
    return math.floor((1000.0 * budget_s - first_step_ms) / step_ms)


def _rounds_to_nearest(step_ms, budget_s, first_step_ms):
    return round((1000.0 * budget_s - first_step_ms) / step_ms) + 1


def _negative_when_nothing_fits(step_ms, budget_s, first_step_ms):
    return math.floor((1000.0 * budget_s - first_step_ms) / step_ms) + 1


def _seconds_as_ms(step_ms, budget_s, first_step_ms):
    return max(math.floor((budget_s - first_step_ms) / step_ms) + 1, 0)


CHECKS = {"ch12_steps_in_budget": check_steps_in_budget}
WRONG_ANSWERS = {
    "ch12_steps_in_budget": [
        _ignores_first_step,
        _forgets_first_step_counts,
        _rounds_to_nearest,
        _negative_when_nothing_fits,
        _seconds_as_ms,
    ],
}
