"""Graded checks of chapter 02 (timing): a step timer that is right on a GPU,
and MFU from a step time.

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
    "ch02_step_timer": "chapter 02, section 4 (Exercise: a step timer that is right on a GPU)",
    "ch02_mfu": "chapter 02, section 5 (From a step time to tokens/s and MFU)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


class FakeAsyncDevice:
    """A stand-in for a GPU, for :func:`check_step_timer`: ``step()`` returns at once but queues
    device work that only ``synchronize()`` waits for, like a CUDA launch. Call k queues
    ``plan_ms[k]`` ms (30 ms once the plan is used up; ``work`` keeps what each call queued); the
    first ``slow_calls`` calls queue ``first_extra_ms`` more, like a first CUDA step."""

    def __init__(self, plan_ms: list[float], first_extra_ms: float = 150.0, slow_calls: int = 2):
        import time

        self._clock = time.perf_counter
        self._sleep = time.sleep
        self.plan_ms, self.first_extra_ms, self.slow_calls = plan_ms, first_extra_ms, slow_calls
        self.busy_until = self._clock()
        self.calls = 0
        self.work: list[float] = []  # ms of work each call queued, in call order

    def step(self) -> None:
        work = self.plan_ms[self.calls] if self.calls < len(self.plan_ms) else 30.0
        self.calls += 1
        self.work.append(work + (self.first_extra_ms if self.calls <= self.slow_calls else 0.0))
        self.busy_until = max(self.busy_until, self._clock()) + self.work[-1] / 1e3

    def synchronize(self) -> None:
        delay = self.busy_until - self._clock()
        if delay > 0:
            self._sleep(delay)


# The timed steps' work, in a random order each run: with 10 and 50 ms both in it, no constant
# (a number made up instead of measured) is within the bounds of every step.
TIMED_WORK_MS = (10.0, 30.0, 50.0, 10.0, 50.0)


def check_step_timer(fn: Callable[..., list[float]]) -> None:
    """Check ``time_steps(step, synchronize, warmup, iters) -> list[float]`` (ms per timed step)
    against :class:`FakeAsyncDevice`: 2 warm-up calls of ~180 ms, then steps of 10, 30 and 50 ms
    of queued work in a random order: each returned time must be its own step's.

    Raises:
        AssertionError: with a hint, for a timer that does not synchronise, reports warm-up steps,
            returns the wrong number of times, or calls step() the wrong number of times.
    """
    gid = "ch02_step_timer"
    import random

    timed = list(TIMED_WORK_MS)
    random.Random().shuffle(timed)
    warmup, iters = 2, len(timed)
    dev = FakeAsyncDevice([30.0] * warmup + timed)
    times = fn(dev.step, dev.synchronize, warmup, iters)
    dev.synchronize()
    if times is None:
        raise AssertionError(
            f"time_steps returned None: return the list of step times. {_reread(gid)}"
        )
    times = [as_number(t, "time_steps(...)[i]", _reread(gid)) for t in times]
    if dev.calls != warmup + iters:
        raise AssertionError(
            f"step() was called {dev.calls} times for warmup={warmup}, iters={iters}: "
            f"call it warmup + iters = {warmup + iters} times. {_reread(gid)}"
        )
    if len(times) != iters:
        raise AssertionError(
            f"time_steps returned {len(times)} times for iters={iters}: "
            f"return one time per timed step, and none for the warm-up steps. {_reread(gid)}"
        )
    if max(times) < 5:
        raise AssertionError(
            f"your times are {[round(t, 2) for t in times]} ms, "
            "but each step queues 10 to 50 ms of device work: step() only launched it. "
            f"Call synchronize() before reading the clock. {_reread(gid)}"
        )
    if max(times) > 100:
        raise AssertionError(
            f"a timed step took {max(times):.0f} ms although each step is 10 to 50 ms: "
            "warm-up work leaked into it. Synchronize after the warm-up steps and exclude them "
            f"from the times. {_reread(gid)}"
        )
    work = dev.work[warmup:]
    if not all(0.9 * w < t < w + 20 for t, w in zip(times, work)):
        raise AssertionError(
            f"times {[round(t, 1) for t in times]} ms, but the timed steps queued "
            f"{[round(w) for w in work]} ms of work: time each step on its own. Start the clock "
            f"after the previous step finished and stop it after synchronize(). {_reread(gid)}"
        )
    passed(
        gid,
        f"time_steps synchronises, skips {warmup} warm-up steps and times each step "
        "(a fake device of 10 to 50 ms steps)",
    )


MFU_CASES = [  # (step_ms, tokens_per_step, flops_per_token, peak_flops)
    (33.7, 16 * 1024, 855_166_464, 989.4e12),
    (366.8, 16 * 1024, 855_166_464, 989.4e12),
    (1000.0, 512, 6e6, 65e12),
]


def check_mfu(fn: Callable[[float, int, float, float], float]) -> None:
    """Check ``mfu(step_ms, tokens_per_step, flops_per_token, peak_flops) -> float`` (a fraction)
    against ``flops_per_token * tokens_per_step / (step_ms / 1e3) / peak_flops``.

    Raises:
        AssertionError: with a hint, when a case differs by more than a relative 1e-6.
    """
    gid = "ch02_mfu"
    for step_ms, tokens, fpt, peak in MFU_CASES:
        call = f"mfu({step_ms}, {tokens}, {fpt}, {peak:g})"
        got = as_number(fn(step_ms, tokens, fpt, peak), call, _reread(gid))
        want = fpt * tokens / (step_ms / 1e3) / peak
        if is_close(got, want):
            continue
        if is_close(got, want / 1e3) or is_close(got, want * 1e3):
            why = (
                f"{call} returned {got:g}, off by 1000x: "
                "convert step_ms to seconds (step_ms / 1e3)."
            )
        elif is_close(got, 100 * want):
            why = f"{call} returned {got:g}: that is a percentage; return the fraction (e.g. 0.42)."
        elif got > 0 and is_close(1 / got, want):
            why = f"{call} returned {got:g}: inverted. MFU = achieved FLOP/s / peak FLOP/s."
        else:
            why = (
                f"{call} returned {got:g}, "
                f"expected {want:.6g} = flops_per_token * tokens/s / peak_flops."
            )
        raise AssertionError(f"{why} {_reread(gid)}")
    passed(
        gid,
        f"mfu(...) == flops_per_token * tokens_per_s / peak_flops for {len(MFU_CASES)} cases",
    )


def _timer_made_up(step, synchronize, warmup, iters):
    for _ in range(warmup + iters):
        step()
    synchronize()
    return [20.0] * iters  # the number the exercise text used to give, not a measurement


def _timer_no_sync(step, synchronize, warmup, iters):
    import time

    for _ in range(warmup):
        step()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        out.append(1e3 * (time.perf_counter() - t0))
    return out


def _timer_includes_warmup(step, synchronize, warmup, iters):
    import time

    out = []
    for _ in range(warmup + iters):
        t0 = time.perf_counter()
        step()
        synchronize()
        out.append(1e3 * (time.perf_counter() - t0))
    return out


def _timer_no_sync_after_warmup(step, synchronize, warmup, iters):
    import time

    for _ in range(warmup):
        step()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        synchronize()
        out.append(1e3 * (time.perf_counter() - t0))
    return out


def _mfu_ms_as_s(step_ms, tokens, fpt, peak):
    return fpt * tokens / step_ms / peak


def _mfu_percent(step_ms, tokens, fpt, peak):
    return 100 * fpt * tokens / (step_ms / 1e3) / peak


CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = {
    "ch02_step_timer": check_step_timer,
    "ch02_mfu": check_mfu,
}

WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch02_step_timer": [
        _timer_no_sync,
        _timer_includes_warmup,
        _timer_no_sync_after_warmup,
        _timer_made_up,
    ],
    "ch02_mfu": [_mfu_ms_as_s, _mfu_percent],
}
