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


def run_learner(fn: Any, harness: Any, *args: Any, **kwargs: Any) -> Any:
    """``harness(fn, *args, **kwargs)`` run where the learner's function ``fn`` lives; what it
    returned, as data.

    In a learner's own notebook ``fn`` is their function and the harness runs here. When grading,
    ``fn`` is a :class:`helpers.grading.remote.RemoteFunction`: the harness runs in the
    submission's kernel beside the learner's function and only data comes back (numbers, strings,
    tensors, dtypes, and lists, tuples and dicts of them), so the check that reads it runs in a
    process where no code of the submission ran. In both cases the result goes through the same
    encoding, so a check sees the same values either way.

    Args:
        fn: the learner's function, or the grader's stand-in for it.
        harness: a module-level function of ``helpers.grading`` taking ``fn`` first; it returns
            what the check needs to judge (outputs, gradients, updated weights), never a verdict
            of its own, because when grading it is the submission's account.

    Raises:
        TypeError: the harness returned something that is not data (a bug of the harness).
    """
    from helpers.grading import remote, wire

    if isinstance(fn, remote.RemoteFunction):
        return fn.run(harness, *args, **kwargs)
    return wire.round_trip(harness(fn, *args, **kwargs))
