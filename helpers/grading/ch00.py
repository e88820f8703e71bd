"""Graded checks of chapter 00 (set-up and hardware): counting a matmul's FLOPs and turning FLOPs
and milliseconds into TFLOP/s.

Every chapter module has the same shape: ``SECTIONS`` (grade id -> the section a failed check's hint
points to), the ``check_*`` functions (run the learner's function on small CPU inputs, print one
``PASS ...`` line, or raise ``AssertionError`` with a hint), ``CHECKS`` (grade id -> check) and
``WRONG_ANSWERS`` (grade id -> plausible mistakes the check must reject; tests/test_grading.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from helpers.grading.common import as_number, is_close, passed, reread

SECTIONS = {
    "ch00_matmul_flops": "chapter 00, section 2 (Counting the FLOPs of a matmul)",
    "ch00_tflops": "chapter 00, section 3 (From FLOPs and milliseconds to TFLOP/s)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


MATMUL_SHAPES = [(2, 3, 4), (7, 1, 5), (64, 128, 32), (1024, 768, 3072)]  # (M, N, K), non-square


def check_matmul_flops(fn: Callable[[int, int, int], int]) -> None:
    """Check ``matmul_flops(M, N, K) -> int``: FLOPs of (M, K) @ (K, N), which is ``2*M*N*K``.

    Each of the M*N outputs is a dot product of length K: K multiplies and K adds, counted as
    2 FLOPs per multiply-add (the convention of GPU datasheets and of Kaplan et al. 2020, §2.1).

    Raises:
        AssertionError: with a hint, when any shape gives a different count.
    """
    gid = "ch00_matmul_flops"
    for M, N, K in MATMUL_SHAPES:
        call = f"matmul_flops({M}, {N}, {K})"
        got = as_number(fn(M, N, K), call, _reread(gid))
        want = 2 * M * N * K
        if got == want:
            continue
        if got == M * N * K:
            why = (
                f"{call} returned {got:,.0f} = M*N*K: you counted the multiplies but not the adds. "
                "Each multiply-add is 2 FLOPs."
            )
        elif got in (2 * M * N, 2 * M * K, 2 * N * K):
            why = f"{call} returned {got:,.0f}: one of M, N, K is missing from your product."
        else:
            why = (
                f"{call} returned {got:,.0f}, expected {want:,} for A of shape (M, K) = ({M}, {K}) "
                f"times B of shape (K, N) = ({K}, {N})."
            )
        raise AssertionError(f"{why} {_reread(gid)}")
    passed(
        gid,
        f"matmul_flops(M, N, K) == 2*M*N*K for {len(MATMUL_SHAPES)} non-square shapes",
    )


TFLOPS_CASES = [(2 * 4096**3, 1.0), (1e12, 1000.0), (3.5e14, 2.5), (1e9, 0.01)]  # (flops, ms)


def check_tflops(fn: Callable[[float, float], float]) -> None:
    """Check ``achieved_tflops(flops, ms) -> float``: ``flops / (ms / 1e3) / 1e12`` TFLOP/s.

    Raises:
        AssertionError: with a hint, when a case differs by more than a relative 1e-6.
    """
    gid = "ch00_tflops"
    for flops, ms in TFLOPS_CASES:
        call = f"achieved_tflops({flops:g}, {ms:g})"
        got = as_number(fn(flops, ms), call, _reread(gid))
        want = flops / (ms / 1e3) / 1e12
        if is_close(got, want):
            continue
        if is_close(got, want / 1e3):
            why = (
                f"{call} returned {got:g}, 1000x too small: ms are milliseconds, "
                "divide ms by 1e3 to get seconds."
            )
        elif is_close(got, want / 1e6):
            why = (
                f"{call} returned {got:g}, 1e6x too small: milliseconds to seconds is "
                "ms / 1e3, not ms * 1e3."
            )
        elif is_close(got, want * 1e12):
            why = f"{call} returned {got:g}: that is FLOP/s; divide by 1e12 to get TFLOP/s."
        elif is_close(got, want * 1e9):
            why = f"{call} returned {got:g}: that is FLOP/ms; convert ms to s and divide by 1e12."
        elif got > 0 and is_close(1.0 / got, want):
            why = f"{call} returned {got:g}: the time goes in the denominator (FLOPs per second)."
        else:
            why = f"{call} returned {got:g}, expected {want:g} TFLOP/s."
        raise AssertionError(f"{why} {_reread(gid)}")
    passed(
        gid,
        f"achieved_tflops(flops, ms) == flops / (ms/1e3) / 1e12 for {len(TFLOPS_CASES)} cases",
    )


# Plausible mistakes, one function each, named for the mistake. Every check must reject all of
# its list (tests/test_grading.py), so a check that passes anything is caught.
def _flops_forgot_add(M: int, N: int, K: int) -> int:
    return M * N * K


def _flops_forgot_k(M: int, N: int, K: int) -> int:
    return 2 * M * N


def _flops_assumes_square(M: int, N: int, K: int) -> int:
    return 2 * M * M * K


def _flops_no_return(M: int, N: int, K: int) -> None:
    2 * M * N * K  # noqa: B018 - the mistake is the missing return


def _tflops_forgot_ms_to_s(flops: float, ms: float) -> float:
    return flops / ms / 1e12


def _tflops_multiplied_ms(flops: float, ms: float) -> float:
    return flops / (ms * 1e3) / 1e12


def _tflops_forgot_tera(flops: float, ms: float) -> float:
    return flops / (ms / 1e3)


def _tflops_inverted(flops: float, ms: float) -> float:
    return (ms / 1e3) / flops * 1e12


CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = {
    "ch00_matmul_flops": check_matmul_flops,
    "ch00_tflops": check_tflops,
}

WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch00_matmul_flops": [
        _flops_forgot_add,
        _flops_forgot_k,
        _flops_assumes_square,
        _flops_no_return,
    ],
    "ch00_tflops": [
        _tflops_forgot_ms_to_s,
        _tflops_multiplied_ms,
        _tflops_forgot_tera,
        _tflops_inverted,
    ],
}
