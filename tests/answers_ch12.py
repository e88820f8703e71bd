"""Right answers for the chapter 12 check, written independently of helpers/grading/ch12.py."""


def steps_in_budget(step_ms: float, budget_s: float, first_step_ms: float) -> int:
    # the first step, then as many more as fit in what is left
    left_ms = budget_s * 1000 - first_step_ms
    return max(int(left_ms // step_ms) + 1, 0)  # none when the first step alone is too long


RIGHT_ANSWERS = {"ch12_steps_in_budget": steps_in_budget}
