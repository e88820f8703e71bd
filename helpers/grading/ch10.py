"""Chapter 10 (profiling): graded checks, listed in :mod:`helpers.grading`.

Both checks run the learner's function on the committed H200 profile table
(``results/h200-profile-table.json``, measured) and on small synthetic tables built here (made up
to catch one mistake each, never shown as measurements).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from helpers.chapters import ch10_profiling as profiling
from helpers.grading.common import passed, reread
from helpers.measure import profiler

SECTIONS = {
    "ch10_dominant_family": "chapter 10, section 8 (Exercise: the dominant kernel family)",
    "ch10_which_chapter": "chapter 10, section 9 (Exercise: from a profile to a chapter)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


def _rows(*spec: tuple[str, str, float, int]) -> list[dict]:
    """Synthetic rows: (name, family, ms each, how many kernels)."""
    rows = []
    for name, fam, ms, n in spec:
        rows += [
            {"name": f"{name}_{i}" if n > 1 else name, "family": fam, "ms": ms, "calls": 1}
            for i in range(n)
        ]
    return rows


def _synthetic_family_tables() -> list[tuple[str, list[dict]]]:
    return [
        # one big matmul kernel, many small elementwise ones that add up to more
        (
            "synthetic: 1 large matmul kernel vs 10 small elementwise ones",
            _rows(
                ("gemm_big", "matmul", 6.0, 1),
                ("vectorized_elementwise_kernel", "elementwise", 0.8, 10),
                ("reduce_kernel", "reduction", 0.5, 2),
            ),
        ),
        # few large attention kernels, many tiny copies
        (
            "synthetic: 2 attention kernels vs 12 tiny copies",
            _rows(
                ("flash_fwd", "attention", 5.0, 1),
                ("flash_bwd", "attention", 4.0, 1),
                ("direct_copy_kernel", "copy / cast", 0.3, 12),
                ("gemm", "matmul", 2.5, 3),
            ),
        ),
        # rows not sorted, the dominant family spread over many mid-size kernels
        (
            "synthetic: unsorted rows, reductions spread over many kernels",
            _rows(
                ("gemm", "matmul", 1.0, 2),
                ("softmax", "reduction", 0.9, 5),
                ("adam", "optimizer", 3.0, 1),
                ("gelu", "elementwise", 0.2, 4),
            )[::-1],
        ),
    ]


def _shipped_tables() -> list[tuple[str, dict, dict]]:
    found = []
    for b in (16, 64):
        loaded = profiling.load_table(profiling.SHIPPED_TABLE, b)
        if loaded is not None:
            prov, table = loaded
            found.append(
                (f"{prov['device']} B={b} (results/{profiling.SHIPPED_TABLE})", prov, table)
            )
    return found


def _largest_kernel_family(rows: list[dict]) -> str:
    return max(rows, key=lambda r: r["ms"])["family"]


def _most_rows_family(rows: list[dict]) -> str:
    return Counter(r["family"] for r in rows).most_common(1)[0][0]


def _fmt_totals(rows: list[dict]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in list(profiler.family_totals(rows).items())[:3])


def check_dominant_family(fn: Callable[[list[dict]], str]) -> None:
    """Check ``dominant_family(table) -> str``: the family with the largest **total** ms.

    ``table``: a list of dicts with "name", "family", "ms" (device ms per step). Run on the H200's
    recorded tables and three synthetic ones.

    Raises:
        AssertionError: with a hint naming the mistake (largest single kernel, most kernels, ...).
    """
    gid = "ch10_dominant_family"
    cases = [
        (label, t["kernels"]) for label, _, t in _shipped_tables()
    ] + _synthetic_family_tables()
    for label, rows in cases:
        got = fn([dict(r) for r in rows])
        want = next(iter(profiler.family_totals(rows)))
        if got == want:
            continue
        if got is None:
            why = "dominant_family returned None: the function needs a `return` statement."
        elif not isinstance(got, str):
            why = (
                f"dominant_family returned {type(got).__name__} {got!r}: return the family name, "
                "a str such as 'matmul'."
            )
        elif got == _largest_kernel_family(rows):
            big = max(rows, key=lambda r: r["ms"])
            why = (
                f"on the {label} table you returned the family of the single largest "
                f"kernel ({got!r}, {big['ms']:.2f} ms), but {want!r} kernels add up to more "
                f"({_fmt_totals(rows)} ms): sum the ms of each family first."
            )
        elif got == _most_rows_family(rows):
            why = (
                f"on the {label} table you returned the family with the most kernels ({got!r}); "
                f"what costs time is the sum of their ms ({_fmt_totals(rows)} ms), "
                "not how many there are."
            )
        else:
            why = (
                f"on the {label} table you returned {got!r}, expected {want!r} "
                f"(largest totals: {_fmt_totals(rows)} ms)."
            )
        raise AssertionError(f"{why} {_reread(gid)}")
    passed(
        gid,
        f"dominant_family sums ms per family on {len(cases)} tables "
        "(the recorded H200 ones and synthetic ones)",
    )


def _synthetic_chapter_cases() -> list[tuple[str, list[dict], float, bool]]:
    return [
        (
            "synthetic: launch-bound, GPU idle 60% of the step",
            _rows(("gemm", "matmul", 2.0, 2), ("elementwise_kernel", "elementwise", 0.1, 20)),
            15.0,
            True,
        ),
        (
            "synthetic: fp32 matmuls dominate",
            _rows(
                ("sgemm", "matmul", 9.0, 4),
                ("vectorized_elementwise_kernel", "elementwise", 0.5, 8),
                ("flash_fwd", "attention", 3.0, 1),
            ),
            45.0,
            False,
        ),
        (
            "synthetic: attention dominates, the largest single kernel is a matmul",
            _rows(
                ("gemm_lm_head", "matmul", 6.0, 1),
                ("flash_bwd", "attention", 4.0, 1),
                ("flash_fwd", "attention", 3.0, 1),
                ("triton_poi_fused", "triton fused", 1.0, 2),
            ),
            16.0,
            True,
        ),
        (
            "synthetic: many small elementwise kernels add up to more than the matmuls",
            _rows(
                ("gemm", "matmul", 5.0, 2),
                ("vectorized_elementwise_kernel", "elementwise", 0.4, 30),
                ("reduce_kernel", "reduction", 0.5, 4),
            ),
            25.0,
            True,
        ),
        (
            "synthetic: a for-loop AdamW dominates",
            _rows(("gemm", "matmul", 1.0, 3), ("adam_step", "optimizer", 0.2, 40)),
            12.0,
            True,
        ),
        (
            "synthetic: GPU idle 30% of the step (just over the 25% rule)",
            _rows(("gemm", "matmul", 5.0, 1), ("flash_fwd", "attention", 2.0, 1)),
            10.0,
            True,
        ),
        (
            "synthetic: kernels of no known family dominate",
            _rows(("nccl_allreduce", "other", 4.0, 2), ("gemm", "matmul", 2.0, 2)),
            12.5,
            True,
        ),
    ]


def check_which_chapter(fn: Callable[[list[dict], float, bool], str]) -> None:
    """Check ``which_chapter(table, step_ms, low_precision) -> str`` ("ch03" ... "ch10").

    The rules (chapter 10, section 9; reference:
    :func:`helpers.chapters.ch10_profiling.suggest_chapter`): GPU idle > 25% of ``step_ms``
    -> "ch05"; else by the family with the largest total ms: matmul -> "ch04" (fp32) or "ch03"
    (already low precision), attention -> "ch06", elementwise / reduction / copy / cast /
    triton fused -> "ch05", optimizer -> "ch09", other -> "ch10".

    Raises:
        AssertionError: with a hint naming the rule that was missed.
    """
    gid = "ch10_which_chapter"
    cases = [(label, t["kernels"], t["step_ms"], True) for label, _, t in _shipped_tables()]
    cases += _synthetic_chapter_cases()
    for label, rows, step_ms, low in cases:
        got = fn([dict(r) for r in rows], step_ms, low)
        want = profiling.suggest_chapter(rows, step_ms, low)
        if got == want:
            continue
        idle = 1 - sum(r["ms"] for r in rows) / step_ms
        by_single = profiling.suggest_chapter(
            [{"family": _largest_kernel_family(rows), "ms": step_ms}], step_ms, low
        )
        if got is None:
            why = "which_chapter returned None: the function needs a `return` statement."
        elif not (
            isinstance(got, str) and len(got) == 4 and got.startswith("ch") and got[2:].isdigit()
        ):
            why = f"which_chapter returned {got!r}: return a chapter id written like 'ch05'."
        elif want == "ch05" and idle > profiling.LAUNCH_BOUND_IDLE:
            why = (
                f"on the {label} table the kernels fill only {100 * (1 - idle):.0f}% of the "
                f"{step_ms:.1f} ms step: the GPU waits for the host {100 * idle:.0f}% of the time, "
                "check that before any family."
            )
        elif got == by_single and want != by_single:
            why = (
                f"on the {label} table you judged by the single largest kernel "
                f"({_largest_kernel_family(rows)}); judge by the family totals "
                f"({_fmt_totals(rows)} ms)."
            )
        elif got in ("ch03", "ch04") and want in ("ch03", "ch04"):
            why = (
                f"on the {label} table (low_precision={low}) matmuls dominate: "
                "in fp32 / TF32 mixed precision helps most (ch04); already in bf16 / fp16, "
                "a larger batch does (ch03)."
            )
        else:
            why = (
                f"on the {label} table (step {step_ms:.1f} ms, low_precision={low}, family totals "
                f"{_fmt_totals(rows)} ms) you returned {got!r}, expected {want!r}."
            )
        raise AssertionError(f"{why} {_reread(gid)}")
    passed(
        gid,
        f"which_chapter follows the rules on {len(cases)} profiles "
        "(the recorded H200 ones and synthetic ones)",
    )


CHECKS: dict[str, Callable[..., Any]] = {
    "ch10_dominant_family": check_dominant_family,
    "ch10_which_chapter": check_which_chapter,
}


# ---- plausible wrong answers: each check must reject every one (tests/test_grading.py) -----------


def _family_of_largest_kernel(table):
    return max(table, key=lambda r: r["ms"])["family"]


def _family_with_most_kernels(table):
    return Counter(r["family"] for r in table).most_common(1)[0][0]


def _family_always_matmul(table):
    return "matmul"


def _family_largest_mean(table):
    sums, counts = Counter(), Counter()
    for r in table:
        sums[r["family"]] += r["ms"]
        counts[r["family"]] += 1
    return max(sums, key=lambda f: sums[f] / counts[f])


def _chapter_always_compile(table, step_ms, low_precision):
    return "ch05"


def _chapter_by_largest_kernel(table, step_ms, low_precision):
    if 1 - sum(r["ms"] for r in table) / step_ms > 0.25:
        return "ch05"
    fam = max(table, key=lambda r: r["ms"])["family"]
    if fam == "matmul":
        return "ch03" if low_precision else "ch04"
    return {"attention": "ch06", "optimizer": "ch09", "other": "ch10"}.get(fam, "ch05")


def _chapter_ignores_idle(table, step_ms, low_precision):
    totals = Counter()
    for r in table:
        totals[r["family"]] += r["ms"]
    fam = totals.most_common(1)[0][0]
    if fam == "matmul":
        return "ch03" if low_precision else "ch04"
    return {"attention": "ch06", "optimizer": "ch09", "other": "ch10"}.get(fam, "ch05")


def _chapter_matmul_always_mixed_precision(table, step_ms, low_precision):
    if 1 - sum(r["ms"] for r in table) / step_ms > 0.25:
        return "ch05"
    totals = Counter()
    for r in table:
        totals[r["family"]] += r["ms"]
    fam = totals.most_common(1)[0][0]
    return {"matmul": "ch04", "attention": "ch06", "optimizer": "ch09", "other": "ch10"}.get(
        fam, "ch05"
    )


def _chapter_idle_over_half(table, step_ms, low_precision):
    if (
        1 - sum(r["ms"] for r in table) / step_ms > 0.5
    ):  # a threshold of its own, not the chapter's 25%
        return "ch05"
    return _chapter_ignores_idle(table, step_ms, low_precision)


def _chapter_other_to_compile(table, step_ms, low_precision):
    got = (
        _chapter_ignores_idle(table, step_ms, low_precision)
        if 1 - sum(r["ms"] for r in table) / step_ms <= 0.25
        else "ch05"
    )
    return "ch05" if got == "ch10" else got  # "other" kernels sent to torch.compile


WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch10_dominant_family": [
        _family_of_largest_kernel,
        _family_with_most_kernels,
        _family_always_matmul,
        _family_largest_mean,
    ],
    "ch10_which_chapter": [
        _chapter_always_compile,
        _chapter_by_largest_kernel,
        _chapter_ignores_idle,
        _chapter_matmul_always_mixed_precision,
        _chapter_idle_over_half,
        _chapter_other_to_compile,
    ],
}
