"""Graded checks of chapter 03 (batch size and memory): AdamW's state in bytes and
a probe for the largest batch.

Every chapter module has the same shape: ``SECTIONS`` (grade id -> the section a failed check's hint
points to), the ``check_*`` functions (run the learner's function on small CPU inputs, print one
``PASS ...`` line, or raise ``AssertionError`` with a hint), ``CHECKS`` (grade id -> check) and
``WRONG_ANSWERS`` (grade id -> plausible mistakes the check must reject; tests/test_grading.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from helpers.grading.common import as_number, passed, reread

SECTIONS = {
    "ch03_adamw_bytes": "chapter 03, section 1 (Memory accounting for GPT-2 124M)",
    "ch03_batch_probe": "chapter 03, section 3 (Probing for the largest batch, done right)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


ADAMW_CASES = [1, 1000, 124_439_808]


def check_adamw_bytes(fn: Callable[[int], int]) -> None:
    """Check ``adamw_state_bytes(n_params) -> int`` = 2 moments x 4 bytes x n_params.

    Raises:
        AssertionError: with a hint, for a wrong count of moments or bytes.
    """
    gid = "ch03_adamw_bytes"
    for n in ADAMW_CASES:
        call = f"adamw_state_bytes({n:,})"
        got = as_number(fn(n), call, _reread(gid))
        want = 8 * n
        if got == want:
            continue
        if got == 4 * n:
            why = (
                f"{call} returned {got:,.0f} = 4 bytes x n: AdamW keeps *two* moments "
                "(exp_avg and exp_avg_sq)."
            )
        elif got == 2 * n:
            why = (
                f"{call} returned {got:,.0f}: the moments are counted, "
                "but each is a 4-byte fp32 number."
            )
        elif got in (16 * n, 12 * n):
            why = (
                f"{call} returned {got:,.0f}: count only the optimizer state, "
                "not the parameters or gradients."
            )
        else:
            why = f"{call} returned {got:,.0f}, expected {want:,}."
        raise AssertionError(f"{why} {_reread(gid)}")
    passed(gid, f"adamw_state_bytes(n) == 8*n (two fp32 moments) for n in {ADAMW_CASES}")


class _FakeBlock:
    """Memory a fake training step holds while its frame (or a traceback to it) is alive."""

    def __init__(self, units: int):
        self.units = units


class FakeMemory:
    """A GPU memory of ``capacity`` units for :func:`check_batch_probe`. ``step(B)`` takes B units;
    memory still referenced by an earlier failed step (kept exception, traceback or outputs) counts
    as used, and a step called while an OOM is being handled fails, as on a real GPU."""

    def __init__(self, capacity: int, max_calls: int = 200):
        import weakref

        self.capacity, self.max_calls, self.calls = capacity, max_calls, 0
        self.live: "weakref.WeakSet[_FakeBlock]" = weakref.WeakSet()
        self.flags: set[str] = set()

    def step(self, B: int):
        import torch

        self.calls += 1
        if self.calls > self.max_calls:
            raise AssertionError(
                f"the probe called try_step more than {self.max_calls} times: does it stop?"
            )
        if sys.exc_info()[0] is not None:
            self.flags.add("inside-except")
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory (fake): the failed step's memory is still held"
            )
        held = sum(b.units for b in self.live)
        if held:
            self.flags.add("kept-reference")
        block = _FakeBlock(B)  # the step's tensors: alive while this frame is referenced
        self.live.add(block)
        if held + B > self.capacity:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory (fake): B={B} needs {B} units, {self.capacity - held} free"
            )
        del block


PROBE_CASES = [(37, 1), (1, 1), (100, 3), (64, 1)]  # (hidden largest B, start)


def check_batch_probe(fn: Callable[..., int]) -> None:
    """Check ``find_max_batch(try_step, start=1) -> int`` against fake steps that raise
    ``torch.cuda.OutOfMemoryError`` above a hidden batch size (:class:`FakeMemory`).

    Raises:
        AssertionError: with a hint, for a wrong answer, a retry inside ``except``, a kept reference
            to a failed step, or a probe that does not stop.
    """
    gid = "ch03_batch_probe"
    import gc

    for hidden, start in PROBE_CASES:
        mem = FakeMemory(hidden)
        got = fn(mem.step, start=start)
        gc.collect()
        if "inside-except" in mem.flags:
            raise AssertionError(
                "try_step was called while an OOM was still being handled (inside `except`): "
                "the failed step's tensors are still referenced there. Record the failure, "
                f"leave the except block, then retry. {_reread(gid)}"
            )
        if "kept-reference" in mem.flags:
            raise AssertionError(
                "memory of a failed step was still referenced at the next try (a kept exception, "
                f"traceback or output). Drop every reference before retrying. {_reread(gid)}"
            )
        got = as_number(got, f"find_max_batch(..., start={start})", _reread(gid))
        if got != hidden:
            why = (
                "too large: it reported a size that raised OOM."
                if got > hidden
                else "too small: bisect between the last size that fit and the first that failed."
            )
            raise AssertionError(
                f"find_max_batch returned {got:g}, but the largest fitting B is {hidden}: "
                f"{why} {_reread(gid)}"
            )
    passed(
        gid,
        f"find_max_batch finds the largest B for {len(PROBE_CASES)} hidden limits, "
        "retrying outside `except`",
    )


def _adamw_one_moment(n):
    return 4 * n


def _adamw_with_params_and_grads(n):
    return 16 * n


def _probe_retry_inside_except(try_step, start=1):
    import torch

    def fits(B):
        try:
            try_step(B)
            return True
        except torch.cuda.OutOfMemoryError:
            return False

    B = start
    while fits(2 * B):
        B *= 2
    try:
        try_step(2 * B)
    except torch.cuda.OutOfMemoryError:  # the seed's mistake: shrink and retry inside except
        lo, hi = B, 2 * B
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo
    return B


def _probe_keeps_exception(try_step, start=1):
    import torch

    errors = []
    good, bad = start, None
    while bad is None:
        try:
            try_step(2 * good)
            good *= 2
        except torch.cuda.OutOfMemoryError as e:
            errors.append(e)  # keeps the traceback, and with it the failed step's memory
            bad = 2 * good
    while bad - good > 1:
        mid = (good + bad) // 2
        try:
            try_step(mid)
            good = mid
        except torch.cuda.OutOfMemoryError as e:
            errors.append(e)
            bad = mid
    return good


def _probe_doubling_only(try_step, start=1):
    import torch

    B = start
    while True:
        failed = False
        try:
            try_step(2 * B)
        except torch.cuda.OutOfMemoryError:
            failed = True
        if failed:
            return B
        B *= 2


CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = {
    "ch03_adamw_bytes": check_adamw_bytes,
    "ch03_batch_probe": check_batch_probe,
}

WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch03_adamw_bytes": [_adamw_one_moment, _adamw_with_params_and_grads],
    "ch03_batch_probe": [_probe_retry_inside_except, _probe_keeps_exception, _probe_doubling_only],
}
