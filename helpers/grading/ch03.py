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

from helpers.grading.common import as_number, passed, reread, run_learner
from helpers.grading.wire import data_or_type_name

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

    def __init__(self, units: Any):
        self.units = units


class FakeMemory:
    """The checker's side of :func:`check_batch_probe`: a GPU memory of ``capacity`` units, which
    decides whether each step fits. The steps run in the learner's interpreter
    (:func:`_harness_batch_probe`), which reports before each one the units still held by earlier
    failed steps and whether an exception is being handled; :meth:`room` records those reports
    (``flags``) and answers: memory still referenced (kept exception, traceback or outputs) counts
    as used, and a step called while an OOM is being handled fails, as on a real GPU."""

    def __init__(self, capacity: int, max_calls: int = 200):
        self.capacity, self.max_calls, self.calls = capacity, max_calls, 0
        self.flags: set[str] = set()

    def room(self, B: Any, held: Any, inside_except: Any) -> bool:
        """Whether step ``B`` fits when ``held`` units are still referenced; False while an
        exception is being handled (``inside_except``)."""
        self.calls += 1
        if self.calls > self.max_calls:
            raise AssertionError(
                f"the probe called try_step more than {self.max_calls} times: does it stop? "
                f"{_reread('ch03_batch_probe')}"
            )
        if isinstance(B, bool) or not isinstance(B, (int, float)):
            raise AssertionError(
                f"try_step was called with B={B!r}: a batch size is a number. "
                f"{_reread('ch03_batch_probe')}"
            )
        if isinstance(held, bool) or not isinstance(held, (int, float)):
            raise AssertionError(f"the learner's side reported {held!r} units held, not a number")
        if inside_except is not False:
            self.flags.add("inside-except")
            return False
        if held != 0:
            self.flags.add("kept-reference")
        return held + B <= self.capacity


def _harness_batch_probe(
    find_max_batch: Callable[..., Any], room: Callable[..., bool], start: int
) -> Any:
    """Run ``find_max_batch(try_step, start=start)`` where the learner's function lives, with a
    ``try_step(B)`` that holds B units of fake memory while its frame (or a traceback to it) is
    alive. Before each step it calls ``room(B, held, inside_except)`` (the checker's
    :meth:`FakeMemory.room`, called back when grading) with what it observes here: ``held``, the
    int units of earlier steps still referenced, and ``inside_except``, a bool, whether the step
    was called while an exception was being handled; it raises ``torch.cuda.OutOfMemoryError``
    when ``room`` answers False.

    Returns:
        what ``find_max_batch`` returned, when that is data (a number, normally); else the str
        ``"<a TYPE>"`` naming its type.
    """
    import weakref

    import torch

    live: weakref.WeakSet[_FakeBlock] = weakref.WeakSet()

    def try_step(B):
        inside = sys.exc_info()[0] is not None
        held = sum(block.units for block in live)
        fits = room(B, held, inside)
        if inside:
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory (fake): the failed step's memory is still held"
            )
        block = _FakeBlock(B)  # the step's tensors: alive while this frame is referenced
        live.add(block)
        if not fits:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (fake): B={B} does not fit")
        del block

    return data_or_type_name(find_max_batch(try_step, start=start))


PROBE_CASES = [(37, 1), (1, 1), (100, 3), (64, 1)]  # (hidden largest B, start)


def check_batch_probe(fn: Callable[..., int]) -> None:
    """Check ``find_max_batch(try_step, start=1) -> int`` against fake steps that raise
    ``torch.cuda.OutOfMemoryError`` above a hidden batch size (:class:`FakeMemory`).

    The hidden size stays here, in the checker: each step asks :meth:`FakeMemory.room` whether it
    fits, so the learner's side never sees it, and the returned size and the number of steps are
    checked here. Whether memory of a failed step was still referenced, or a step ran inside
    ``except``, is observed where the learner's function runs (:func:`_harness_batch_probe`): when
    grading, that is the submission's own report.

    Raises:
        AssertionError: with a hint, for a wrong answer, a retry inside ``except``, a kept reference
            to a failed step, or a probe that does not stop.
    """
    gid = "ch03_batch_probe"
    for hidden, start in PROBE_CASES:
        mem = FakeMemory(hidden)
        got = run_learner(fn, _harness_batch_probe, mem.room, start)
        if mem.calls > mem.max_calls:  # the AssertionError of room() was caught
            raise AssertionError(
                f"the probe called try_step more than {mem.max_calls} times: does it stop? "
                f"{_reread(gid)}"
            )
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
