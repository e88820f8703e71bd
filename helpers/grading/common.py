"""What the checks of every chapter share: the hint's pointer to a section, and reading a number
that a learner's function returned."""

from __future__ import annotations

import math
import textwrap
from typing import Any


def reread(section: str) -> str:
    """The end of every failed check's message: ``"Reread chapter 02, section 5 (...)."``"""
    return f"Reread {section}."


def as_number(value: Any, call: str, hint: str) -> float:
    """``float(value)``, or an AssertionError that says the learner's function returned no number.

    Args:
        value: what the learner's function returned.
        call: the call as the learner would write it, e.g. ``"matmul_flops(2, 3, 4)"``.
        hint: the sentence that ends the message (:func:`reread` of the exercise's section).

    Raises:
        AssertionError: ``value`` is None, a bool, or cannot be converted with ``float``.
    """
    if value is None:
        raise AssertionError(
            f"{call} returned None: the function needs a `return` statement. {hint}"
        )
    if isinstance(value, bool):
        raise AssertionError(f"{call} returned a bool ({value}), expected a number. {hint}")
    try:
        return float(value)  # int, float, numpy scalar, 0-d torch tensor
    except (TypeError, ValueError):
        raise AssertionError(
            f"{call} returned {type(value).__name__} {value!r}, expected a number. {hint}"
        ) from None


def is_close(a: float, b: float, rel: float = 1e-6) -> bool:
    """``math.isclose`` with a relative tolerance ``rel`` and an absolute floor of 1e-12."""
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def passed(grade_id: str, what: str, width: int = 100) -> None:
    """Print a check's one PASS message, "PASS <grade_id>: <what>", wrapped at ``width`` columns
    (continuation lines indented two spaces), so a notebook's output is never a line it clips."""
    print(textwrap.fill(f"PASS {grade_id}: {what}", width, subsequent_indent="  "))
