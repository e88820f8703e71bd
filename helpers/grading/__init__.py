"""Graded exercises: the checks learners call, and the teacher's tools around them.

- **Checks**: one module per chapter (``ch00`` ... ``ch14``, all the same shape: ``SECTIONS``, the
  ``check_*`` functions, ``CHECKS``, ``WRONG_ANSWERS``), found by file name and listed in
  :data:`CHAPTERS`. A check runs the learner's function on small CPU inputs and prints one
  ``PASS ...`` message (:func:`helpers.grading.common.passed`, wrapped at 100 columns), or raises
  ``AssertionError`` whose first line says what is wrong and which section to reread. Notebooks
  call them as ``grading.check_matmul_flops(fn)``.
- **Student versions** (:mod:`helpers.grading.student`, ``python -m helpers.grading make-student``).
- **Grading** (:mod:`helpers.grading.grader`, ``python -m helpers.grading grade``): each
  submission runs in a fresh kernel (:mod:`helpers.grading.kernel`), inside an OS sandbox where
  the machine allows it (:mod:`helpers.grading.sandbox`).
- **Leaderboard** (:mod:`helpers.grading.leaderboard`, ``python -m helpers.grading leaderboard``):
  every learner's capstone ladder, validated, ranked per GPU model.

Teacher guide with the exact commands: docs/grading.md.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

from helpers.grading import common, grader, kernel, leaderboard, sandbox, student
from helpers.grading.grader import (
    COLUMNS,
    grade,
    grade_notebook,
    load_references,
    main,
    totals_table,
    write_csv,
)
from helpers.grading.kernel import CellRun, NotebookRun, execute_notebook, kernel_env
from helpers.grading.student import (
    CODE_STUB,
    TEXT_STUB,
    SolutionMarkerError,
    check_cells,
    has_exercises,
    is_check_cell,
    is_solution_cell,
    make_student,
    nbgrader_metadata,
    student_version,
)


def chapter_modules() -> tuple[ModuleType, ...]:
    """The chapters' checks modules (``helpers/grading/chNN.py``), imported, in the order of NN.

    A chapter's module is found by its file name, so adding ``chNN.py`` is all it takes to register
    its checks (:data:`CHECKS`) and export them (``grading.check_...``).
    """
    names = sorted(
        m.name for m in pkgutil.iter_modules(__path__) if re.fullmatch(r"ch[0-9]{2}", m.name)
    )
    return tuple(importlib.import_module(f"{__name__}.{n}") for n in names)


def merged(modules: tuple[ModuleType, ...], table: str) -> dict[str, Any]:
    """One of the chapters' tables (``"SECTIONS"``, ``"CHECKS"`` or ``"WRONG_ANSWERS"``) merged over
    ``modules``, keyed by grade id.

    Raises:
        RuntimeError: two modules define the same grade id.
    """
    out: dict[str, Any] = {}
    for module in modules:
        part = getattr(module, table)
        clash = sorted(set(out) & set(part))
        if clash:
            raise RuntimeError(f"{module.__name__} redefines grade ids {clash}")
        out.update(part)
    return out


# The registry: every chapter with graded checks, in the order of their numbers.
CHAPTERS: tuple[ModuleType, ...] = chapter_modules()
SECTIONS: dict[str, str] = merged(CHAPTERS, "SECTIONS")
CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = merged(CHAPTERS, "CHECKS")
WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = merged(CHAPTERS, "WRONG_ANSWERS")


def _export() -> list[str]:
    """Bind each chapter module and each check at package level (notebooks call
    ``grading.check_matmul_flops(fn)``); return the names bound.

    Raises:
        RuntimeError: two checks share a function name, or a chapter or check name is already
            another of the package's names.
    """
    exported: dict[str, Any] = {m.__name__.rsplit(".", 1)[1]: m for m in CHAPTERS}
    clash = set()
    for fn in CHECKS.values():
        name = fn.__name__
        if exported.get(name, fn) is not fn:
            clash.add(name)
        exported[name] = fn
    clash |= {n for n, v in exported.items() if n in globals() and globals()[n] is not v}
    if clash:
        raise RuntimeError(f"grading names {sorted(clash)} are defined twice: rename the check")
    globals().update(exported)
    return list(exported)


__all__ = [
    "common",
    "grader",
    "kernel",
    "leaderboard",
    "sandbox",
    "student",
    "COLUMNS",
    "CellRun",
    "NotebookRun",
    "execute_notebook",
    "grade",
    "grade_notebook",
    "kernel_env",
    "load_references",
    "main",
    "totals_table",
    "write_csv",
    "CODE_STUB",
    "TEXT_STUB",
    "SolutionMarkerError",
    "check_cells",
    "has_exercises",
    "is_check_cell",
    "is_solution_cell",
    "make_student",
    "nbgrader_metadata",
    "student_version",
    "CHAPTERS",
    "SECTIONS",
    "CHECKS",
    "WRONG_ANSWERS",
    "merged",
    "chapter_modules",
]
__all__ += _export()
