"""Graded exercises: the checks learners call, and the teacher's tools around them.

- **Checks**: one module per chapter (``ch00`` ... ``ch14``, all the same shape: ``SECTIONS``, the
  ``check_*`` functions, ``CHECKS``, ``WRONG_ANSWERS``), listed in :data:`CHAPTERS`. A check runs
  the learner's function on small CPU inputs and prints one ``PASS ...`` message
  (:func:`helpers.grading.common.passed`, wrapped at 100 columns), or raises
  ``AssertionError`` whose first line says what is wrong and which section to reread. Notebooks call
  them as ``grading.check_matmul_flops(fn)``.
- **Student versions** (:mod:`helpers.grading.student`, ``python -m helpers.grading make-student``).
- **Grading** (:mod:`helpers.grading.grader`, ``python -m helpers.grading grade``): each
  submission runs in a fresh kernel (:mod:`helpers.grading.kernel`), inside an OS sandbox where
  the machine allows it (:mod:`helpers.grading.sandbox`).
- **Leaderboard** (:mod:`helpers.grading.leaderboard`, ``python -m helpers.grading leaderboard``):
  every learner's capstone ladder, validated, ranked per GPU model.

Teacher guide with the exact commands: docs/grading.md.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from helpers.grading import (
    ch00,
    ch01,
    ch02,
    ch03,
    ch04,
    ch05,
    ch06,
    ch07,
    ch08,
    ch09,
    ch10,
    ch11,
    ch12,
    ch13,
    ch14,
    common,
    grader,
    kernel,
    leaderboard,
    sandbox,
    student,
)
from helpers.grading.ch00 import check_matmul_flops, check_tflops
from helpers.grading.ch01 import check_block_params, check_loss_at_init
from helpers.grading.ch02 import check_mfu, check_step_timer
from helpers.grading.ch03 import check_adamw_bytes, check_batch_probe
from helpers.grading.ch04 import check_autocast_dtype, check_autocast_step
from helpers.grading.ch05 import check_compile_pays_off, check_fused_chain
from helpers.grading.ch06 import check_online_softmax, check_sdpa_attention
from helpers.grading.ch07 import check_masked_sampling, check_pad_vocab
from helpers.grading.ch08 import check_max_batch_15gb, check_recipe_dtype
from helpers.grading.ch09 import check_accumulation_step, check_checkpointed_block
from helpers.grading.ch10 import check_dominant_family, check_which_chapter
from helpers.grading.ch11 import check_allreduce_mean, check_shard_batches
from helpers.grading.ch12 import check_steps_in_budget
from helpers.grading.ch13 import check_kv_attention
from helpers.grading.ch14 import check_fragmentation, check_trace_peak
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

# The registry: every chapter with graded checks, in the order of their numbers. A new chapter's
# checks module is added here and nowhere else.
CHAPTERS: tuple[ModuleType, ...] = (
    ch00,
    ch01,
    ch02,
    ch03,
    ch04,
    ch05,
    ch06,
    ch07,
    ch08,
    ch09,
    ch10,
    ch11,
    ch12,
    ch13,
    ch14,
)


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


SECTIONS: dict[str, str] = merged(CHAPTERS, "SECTIONS")
CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = merged(CHAPTERS, "CHECKS")
WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = merged(CHAPTERS, "WRONG_ANSWERS")

__all__ = [
    "ch00",
    "ch01",
    "ch02",
    "ch03",
    "ch04",
    "ch05",
    "ch06",
    "ch07",
    "ch08",
    "ch09",
    "ch10",
    "ch11",
    "ch12",
    "ch13",
    "ch14",
    "common",
    "grader",
    "kernel",
    "leaderboard",
    "sandbox",
    "student",
    "check_matmul_flops",
    "check_tflops",
    "check_block_params",
    "check_loss_at_init",
    "check_mfu",
    "check_step_timer",
    "check_adamw_bytes",
    "check_batch_probe",
    "check_autocast_dtype",
    "check_autocast_step",
    "check_compile_pays_off",
    "check_fused_chain",
    "check_online_softmax",
    "check_sdpa_attention",
    "check_masked_sampling",
    "check_pad_vocab",
    "check_max_batch_15gb",
    "check_recipe_dtype",
    "check_accumulation_step",
    "check_checkpointed_block",
    "check_dominant_family",
    "check_which_chapter",
    "check_allreduce_mean",
    "check_shard_batches",
    "check_steps_in_budget",
    "check_kv_attention",
    "check_trace_peak",
    "check_fragmentation",
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
]
