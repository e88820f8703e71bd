"""Graded exercises: the checks learners call, and the teacher's tools around them.

Three parts, one idea each:

1. **Checks** (``check_matmul_flops`` ...): run the learner's function on small CPU inputs, print one
   ``PASS ...`` line, or raise ``AssertionError`` whose first line says what is wrong and which
   section to reread. ``CHECKS`` maps each nbgrader ``grade_id`` to its check; ``WRONG_ANSWERS``
   holds plausible mistakes that each check must reject (the tests use them).
2. **Student versions** (``python -m helpers.grading make-student``): nbgrader's notebook format
   (schema 3, ``### BEGIN SOLUTION`` / ``### END SOLUTION`` markers), solutions replaced by a stub,
   outputs cleared. nbgrader itself is not needed.
3. **Grading** (``python -m helpers.grading grade``): every submission runs in a fresh kernel; a
   check cell scores its points (taken from the reference notebook) when it runs without error.

nbgrader's format: https://nbgrader.readthedocs.io/en/stable/user_guide/creating_and_grading_assignments.html
Teacher guide with the exact commands: docs/grading.md.
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------------------------
# 1. Checks
# --------------------------------------------------------------------------------------------

# Where each exercise is explained: the hint of a failed check points there. One place to edit
# when a chapter's sections are renumbered.
SECTIONS = {
    "ch00_matmul_flops": "chapter 00, section 2 (Counting the FLOPs of a matmul)",
    "ch00_tflops": "chapter 00, section 3 (From FLOPs and milliseconds to TFLOP/s)",
    "ch01_loss_at_init": "chapter 01, section 4 (The loss before training)",
    "ch01_block_params": "chapter 01, section 2 (Where the parameters are)",
    "ch02_step_timer": "chapter 02, section 4 (Exercise: a step timer that is right on a GPU)",
    "ch02_mfu": "chapter 02, section 5 (From a step time to tokens/s and MFU)",
    "ch03_adamw_bytes": "chapter 03, section 1 (Memory accounting for GPT-2 124M)",
    "ch03_batch_probe": "chapter 03, section 3 (Probing for the largest batch, done right)",
    "ch04_autocast_step": "chapter 04, section 6 (Exercise: a correct autocast training step)",
    "ch04_autocast_dtype": "chapter 04, section 2 (Exercise: which autocast dtype for which GPU)",
    "ch06_sdpa_attention": "chapter 06, section 2 (Exercise: SDPA in the attention block)",
    "ch06_online_softmax": "chapter 06, section 3 (The idea behind FlashAttention: online softmax)",
    "ch07_pad_vocab": "chapter 07, section 2 (Padding the vocabulary)",
    "ch07_masked_sampling": "chapter 07, section 3 (Padded ids must never be sampled)",
}


def _reread(grade_id: str) -> str:
    return f"Reread {SECTIONS[grade_id]}."


def _as_number(value: Any, call: str, grade_id: str) -> float:
    """``float(value)``, or an AssertionError that says the learner's function returned no number."""
    if value is None:
        raise AssertionError(
            f"{call} returned None: the function needs a `return` statement. {_reread(grade_id)}"
        )
    if isinstance(value, bool):
        raise AssertionError(
            f"{call} returned a bool ({value}), expected a number. {_reread(grade_id)}"
        )
    try:
        return float(value)  # int, float, numpy scalar, 0-d torch tensor
    except (TypeError, ValueError):
        raise AssertionError(
            f"{call} returned {type(value).__name__} {value!r}, expected a number. {_reread(grade_id)}"
        ) from None


def _close(a: float, b: float, rel: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


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
        got = _as_number(fn(M, N, K), call, gid)
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
    print(
        f"PASS {gid}: matmul_flops(M, N, K) == 2*M*N*K for {len(MATMUL_SHAPES)} non-square shapes"
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
        got = _as_number(fn(flops, ms), call, gid)
        want = flops / (ms / 1e3) / 1e12
        if _close(got, want):
            continue
        if _close(got, want / 1e3):
            why = f"{call} returned {got:g}, 1000x too small: ms are milliseconds, divide ms by 1e3 to get seconds."
        elif _close(got, want / 1e6):
            why = f"{call} returned {got:g}, 1e6x too small: milliseconds to seconds is ms / 1e3, not ms * 1e3."
        elif _close(got, want * 1e12):
            why = f"{call} returned {got:g}: that is FLOP/s; divide by 1e12 to get TFLOP/s."
        elif _close(got, want * 1e9):
            why = f"{call} returned {got:g}: that is FLOP/ms; convert ms to s and divide by 1e12."
        elif got > 0 and _close(1.0 / got, want):
            why = f"{call} returned {got:g}: the time goes in the denominator (FLOPs per second)."
        else:
            why = f"{call} returned {got:g}, expected {want:g} TFLOP/s."
        raise AssertionError(f"{why} {_reread(gid)}")
    print(
        f"PASS {gid}: achieved_tflops(flops, ms) == flops / (ms/1e3) / 1e12 for {len(TFLOPS_CASES)} cases"
    )


VOCAB_SIZES = [2, 65, 1000, 50257, 50304]


def check_loss_at_init(fn: Callable[[int], float]) -> None:
    """Check ``expected_initial_loss(vocab_size) -> float``: ``ln(vocab_size)`` nats.

    A model that spreads probability evenly gives every target ``p = 1/V``; cross-entropy is
    ``-ln(p) = ln(V)`` (natural log, as ``F.cross_entropy`` uses). For GPT-2, ln(50257) ≈ 10.825.

    Raises:
        AssertionError: with a hint, when a vocabulary size differs by more than 1e-4.
    """
    gid = "ch01_loss_at_init"
    for V in VOCAB_SIZES:
        call = f"expected_initial_loss({V})"
        got = _as_number(fn(V), call, gid)
        want = math.log(V)
        if abs(got - want) <= 1e-4:
            continue
        if abs(got - math.log10(V)) <= 1e-4:
            why = f"{call} returned {got:.4f} = log10(V): cross-entropy uses the natural log (math.log)."
        elif abs(got - math.log2(V)) <= 1e-4:
            why = f"{call} returned {got:.4f} = log2(V), in bits: PyTorch's cross-entropy is in nats (math.log)."
        elif abs(got - 1.0 / V) <= 1e-6:
            why = f"{call} returned {got:.6f} = 1/V: that is the probability of the target, not the loss -ln(p)."
        elif abs(got + want) <= 1e-4:
            why = (
                f"{call} returned {got:.4f}: the loss is -ln(p), a positive number; check the sign."
            )
        else:
            why = f"{call} returned {got:.4f}, expected {want:.4f} nats."
        raise AssertionError(f"{why} {_reread(gid)}")
    print(f"PASS {gid}: expected_initial_loss(V) == ln(V) for V in {VOCAB_SIZES}")


BLOCK_WIDTHS = [(64, 4), (96, 3), (128, 8), (768, 12)]  # (n_embd, n_head), n_head divides n_embd


def measured_block_parameters(n_embd: int, n_head: int) -> int:
    """Parameters of one ``helpers.model.Block``, counted on the real module (sum of numel)."""
    from helpers.model import Block, GPTConfig  # torch is imported only when this check runs

    block = Block(GPTConfig(n_embd=n_embd, n_head=n_head, block_size=8))
    return sum(p.numel() for p in block.parameters())


def check_block_params(fn: Callable[[int], int]) -> None:
    """Check ``block_parameters(n_embd) -> int`` against a real ``helpers.model.Block``.

    The expected count is measured, not written down: each width builds a Block and sums
    ``p.numel()`` over its parameters (buffers such as the causal mask are not parameters).

    Raises:
        AssertionError: with a hint, when a width gives a different count.
    """
    gid = "ch01_block_params"
    for C, n_head in BLOCK_WIDTHS:
        call = f"block_parameters({C})"
        got = _as_number(fn(C), call, gid)
        want = measured_block_parameters(C, n_head)
        if got == want:
            continue
        weights = 12 * C * C  # the matrices of attention (4 C^2) and MLP (8 C^2)
        missing = want - got
        if got == weights:
            why = (
                f"{call} returned {got:,.0f}: you counted the weight matrices, but no biases and no "
                "LayerNorm parameters. Every nn.Linear here has a bias; each nn.LayerNorm has a weight and a bias."
            )
        elif missing == 4 * C:
            why = f"{call} returned {got:,.0f}, {missing:,.0f} short: the two LayerNorms each have a weight and a bias of size C."
        elif missing == 2 * C:
            why = f"{call} returned {got:,.0f}, {missing:,.0f} short: a LayerNorm has a bias as well as a weight, and a Block has two LayerNorms."
        elif 0 < missing < 13 * C and missing % C == 0:
            why = f"{call} returned {got:,.0f}, {missing:,.0f} = {missing // C}*C short: some biases or LayerNorm parameters are missing."
        elif got in (4 * C * C, 8 * C * C) or abs(missing) >= C * C:
            why = (
                f"{call} returned {got:,.0f}, expected {want:,}: a weight matrix is off. Count c_attn (C -> 3C), "
                "attn.c_proj (C -> C), mlp.c_fc (C -> 4C) and mlp.c_proj (4C -> C)."
            )
        else:
            why = (
                f"{call} returned {got:,.0f}, expected {want:,} (measured on helpers.model.Block)."
            )
        raise AssertionError(f"{why} {_reread(gid)}")
    widths = [C for C, _ in BLOCK_WIDTHS]
    print(f"PASS {gid}: block_parameters(C) matches helpers.model.Block for C in {widths}")


# --------------------------------------------------------------------------------------------
# Chapters 02 and 03
# --------------------------------------------------------------------------------------------


class FakeAsyncDevice:
    """A stand-in for a GPU, for :func:`check_step_timer`: ``step()`` returns at once but queues
    ``work_ms`` of "device" work that only ``synchronize()`` waits for, like a CUDA launch. The
    first ``slow_calls`` steps queue ``first_extra_ms`` more, like a first CUDA step."""

    def __init__(self, work_ms: float = 20.0, first_extra_ms: float = 150.0, slow_calls: int = 2):
        import time

        self._clock = time.perf_counter
        self._sleep = time.sleep
        self.work_ms, self.first_extra_ms, self.slow_calls = work_ms, first_extra_ms, slow_calls
        self.busy_until = self._clock()
        self.calls = 0

    def step(self) -> None:
        self.calls += 1
        extra = self.first_extra_ms if self.calls <= self.slow_calls else 0.0
        self.busy_until = max(self.busy_until, self._clock()) + (self.work_ms + extra) / 1e3

    def synchronize(self) -> None:
        delay = self.busy_until - self._clock()
        if delay > 0:
            self._sleep(delay)


def check_step_timer(fn: Callable[..., list[float]]) -> None:
    """Check ``time_steps(step, synchronize, warmup, iters) -> list[float]`` (ms per timed step)
    against :class:`FakeAsyncDevice`: 2 warm-up calls of ~170 ms, then steps of 20 ms of queued work.

    Raises:
        AssertionError: with a hint, for a timer that does not synchronise, reports warm-up steps,
            returns the wrong number of times, or calls step() the wrong number of times.
    """
    gid = "ch02_step_timer"
    dev = FakeAsyncDevice()
    warmup, iters = 2, 5
    times = fn(dev.step, dev.synchronize, warmup, iters)
    dev.synchronize()
    if times is None:
        raise AssertionError(f"time_steps returned None: return the list of step times. {_reread(gid)}")
    times = [_as_number(t, "time_steps(...)[i]", gid) for t in times]
    if dev.calls != warmup + iters:
        raise AssertionError(
            f"step() was called {dev.calls} times for warmup={warmup}, iters={iters}: call it warmup + iters = "
            f"{warmup + iters} times. {_reread(gid)}")
    if len(times) != iters:
        raise AssertionError(
            f"time_steps returned {len(times)} times for iters={iters}: return one time per timed step, "
            f"and none for the warm-up steps. {_reread(gid)}")
    if max(times) < 5:
        raise AssertionError(
            f"your times are {[round(t, 2) for t in times]} ms, but each step queues 20 ms of device work: "
            f"step() only launched it. Call synchronize() before reading the clock. {_reread(gid)}")
    if max(times) > 100:
        raise AssertionError(
            f"a timed step took {max(times):.0f} ms although each step is 20 ms: warm-up work leaked into it. "
            f"Synchronize after the warm-up steps and exclude them from the times. {_reread(gid)}")
    if not all(12 < t < 60 for t in times):
        raise AssertionError(
            f"times {[round(t, 1) for t in times]} ms: each should be about 20 ms (one step's work). "
            f"Start the clock after the previous step finished and stop it after synchronize(). {_reread(gid)}")
    print(f"PASS {gid}: time_steps synchronises, skips {warmup} warm-up steps and times each step (fake 20 ms device)")


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
        got = _as_number(fn(step_ms, tokens, fpt, peak), call, gid)
        want = fpt * tokens / (step_ms / 1e3) / peak
        if _close(got, want):
            continue
        if _close(got, want / 1e3) or _close(got, want * 1e3):
            why = f"{call} returned {got:g}, off by 1000x: convert step_ms to seconds (step_ms / 1e3)."
        elif _close(got, 100 * want):
            why = f"{call} returned {got:g}: that is a percentage; return the fraction (e.g. 0.42)."
        elif got > 0 and _close(1 / got, want):
            why = f"{call} returned {got:g}: inverted. MFU = achieved FLOP/s / peak FLOP/s."
        else:
            why = f"{call} returned {got:g}, expected {want:.6g} = flops_per_token * tokens/s / peak_flops."
        raise AssertionError(f"{why} {_reread(gid)}")
    print(f"PASS {gid}: mfu(...) == flops_per_token * tokens_per_s / peak_flops for {len(MFU_CASES)} cases")


ADAMW_CASES = [1, 1000, 124_439_808]


def check_adamw_bytes(fn: Callable[[int], int]) -> None:
    """Check ``adamw_state_bytes(n_params) -> int`` = 2 moments x 4 bytes x n_params.

    Raises:
        AssertionError: with a hint, for a wrong count of moments or bytes.
    """
    gid = "ch03_adamw_bytes"
    for n in ADAMW_CASES:
        call = f"adamw_state_bytes({n:,})"
        got = _as_number(fn(n), call, gid)
        want = 8 * n
        if got == want:
            continue
        if got == 4 * n:
            why = f"{call} returned {got:,.0f} = 4 bytes x n: AdamW keeps *two* moments (exp_avg and exp_avg_sq)."
        elif got == 2 * n:
            why = f"{call} returned {got:,.0f}: the moments are counted, but each is a 4-byte fp32 number."
        elif got in (16 * n, 12 * n):
            why = f"{call} returned {got:,.0f}: count only the optimizer state, not the parameters or gradients."
        else:
            why = f"{call} returned {got:,.0f}, expected {want:,}."
        raise AssertionError(f"{why} {_reread(gid)}")
    print(f"PASS {gid}: adamw_state_bytes(n) == 8*n (two fp32 moments) for n in {ADAMW_CASES}")


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
            raise AssertionError(f"the probe called try_step more than {self.max_calls} times: does it stop?")
        if sys.exc_info()[0] is not None:
            self.flags.add("inside-except")
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (fake): the failed step's memory is still held")
        held = sum(b.units for b in self.live)
        if held:
            self.flags.add("kept-reference")
        block = _FakeBlock(B)  # the step's tensors: alive while this frame is referenced
        self.live.add(block)
        if held + B > self.capacity:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (fake): B={B} needs {B} units, {self.capacity - held} free")
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
                "try_step was called while an OOM was still being handled (inside `except`): the failed step's "
                f"tensors are still referenced there. Record the failure, leave the except block, then retry. {_reread(gid)}")
        if "kept-reference" in mem.flags:
            raise AssertionError(
                "memory of a failed step was still referenced at the next try (a kept exception, traceback or "
                f"output). Drop every reference before retrying. {_reread(gid)}")
        got = _as_number(got, f"find_max_batch(..., start={start})", gid)
        if got != hidden:
            why = "too large: it reported a size that raised OOM." if got > hidden else \
                "too small: bisect between the last size that fit and the first that failed."
            raise AssertionError(f"find_max_batch returned {got:g}, but the largest fitting B is {hidden}: {why} {_reread(gid)}")
    print(f"PASS {gid}: find_max_batch finds the largest B for {len(PROBE_CASES)} hidden limits, retrying outside `except`")


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


# --------------------------------------------------------------------------------------------
# Chapters 06 and 07
# --------------------------------------------------------------------------------------------


def check_sdpa_attention(fn: Callable[..., Any]) -> None:
    """Check ``causal_attention(q, k, v)`` written with SDPA: same output and gradients as the manual
    reference (fp32, relative error < 1e-4), and no (T, T) tensor allocated in forward or backward,
    measured by recording the shape of every tensor the ops return.

    Raises:
        AssertionError: with a hint, for a wrong result or a materialised (T, T) tensor.
    """
    import torch

    from helpers import attention, hardware

    gid = "ch06_sdpa_attention"
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 96, 16) for _ in range(3))
    with hardware.cpu_sdpa_kernels():  # CPU tensors: the CPU's fused kernel, also while a T4 is emulated
        out = fn(q, k, v)
    if out is None:
        raise AssertionError(f"causal_attention returned None: return the attention output. {_reread(gid)}")
    ref = attention.manual_attention(q, k, v)
    if tuple(out.shape) != tuple(ref.shape):
        raise AssertionError(f"causal_attention returned shape {tuple(out.shape)}, expected {tuple(ref.shape)} = (B, nh, T, hs). {_reread(gid)}")
    err = attention.relative_error(out, ref)
    if not err < 1e-4:
        with hardware.cpu_sdpa_kernels():
            noncausal = attention.relative_error(torch.nn.functional.scaled_dot_product_attention(q, k, v), out)
        why = ("the output matches attention *without* the causal mask: pass is_causal=True."
               if noncausal < 1e-4 else f"relative error {err:.2e} against the manual causal attention.")
        raise AssertionError(f"{why} {_reread(gid)}")
    square = attention.square_score_tensors(fn, q, k, v)
    if square:
        ops = sorted({op for op, _ in square})
        raise AssertionError(
            f"{len(square)} tensors of shape (..., T, T) were allocated (by {', '.join(ops[:4])}): build no score matrix or "
            f"mask tensor; call F.scaled_dot_product_attention(q, k, v, is_causal=True). {_reread(gid)}")
    print(f"PASS {gid}: same output as manual attention (rel. error {err:.1e}) and no (T, T) tensor in forward or backward")


def check_online_softmax(fn: Callable[..., Any]) -> None:
    """Check ``combine_two_tiles(s1, v1, s2, v2)`` = softmax([s1, s2]) @ [v1; v2], computed with the
    online-softmax recurrence: exact on random and on huge scores (1e4, where exp overflows), and
    without building the concatenated (N, t1 + t2) scores.

    Raises:
        AssertionError: with a hint.
    """
    import torch

    from helpers import attention

    gid = "ch06_online_softmax"
    g = torch.Generator().manual_seed(0)
    N, t1, t2, d = 5, 7, 11, 3
    for scale in (1.0, 1e4):
        s1, s2 = torch.randn(N, t1, generator=g) * scale, torch.randn(N, t2, generator=g) * scale
        v1, v2 = torch.randn(t1, d, generator=g), torch.randn(t2, d, generator=g)
        ref = torch.cat([s1, s2], dim=1).double().softmax(dim=1) @ torch.cat([v1, v2]).double()
        rec = attention.TensorShapeRecorder()
        with rec:
            out = fn(s1, v1, s2, v2)
        if out is None:
            raise AssertionError(f"combine_two_tiles returned None. {_reread(gid)}")
        if any(len(shape) >= 1 and shape[-1] == t1 + t2 for _, shape in rec.shapes):
            raise AssertionError(
                f"a tensor with {t1 + t2} = t1 + t2 columns was built: that is the full score row. Keep one tile at a "
                f"time: a running max, a running denominator and a running output. {_reread(gid)}")
        if not torch.isfinite(out).all():
            raise AssertionError(
                f"with scores of size ~{scale:g} the result has inf/nan: subtract the running max before exp(). {_reread(gid)}")
        err = attention.relative_error(out, ref)
        if not err < 1e-5:
            raise AssertionError(
                f"relative error {err:.2e} (scores ~{scale:g}): when the max grows from m1 to m, rescale the first tile's "
                f"denominator and output by exp(m1 - m) before adding the second tile. {_reread(gid)}")
    print(f"PASS {gid}: two tiles combined exactly (also with scores of 1e4), never building the full score row")


PAD_CASES = [(50257, 64, 50304), (50257, 128, 50304), (50304, 64, 50304), (768, 64, 768), (1, 8, 8), (65, 64, 128)]


def check_pad_vocab(fn: Callable[[int, int], int]) -> None:
    """Check ``pad_vocab(n, multiple) -> int``: the smallest multiple of ``multiple`` that is >= n.

    Raises:
        AssertionError: with a hint.
    """
    gid = "ch07_pad_vocab"
    for n, m, want in PAD_CASES:
        call = f"pad_vocab({n}, {m})"
        got = _as_number(fn(n, m), call, gid)
        if got == want:
            continue
        if got < n:
            why = f"{call} returned {got:g} < {n}: rounding down drops real tokens; round up."
        elif n % m == 0:
            why = f"{call} returned {got:g}: {n} is already a multiple of {m}, so it must stay {n}."
        elif got % m:
            why = f"{call} returned {got:g}, which is not a multiple of {m}."
        else:
            why = f"{call} returned {got:g}, expected {want} (the *smallest* multiple >= n)."
        raise AssertionError(f"{why} {_reread(gid)}")
    print(f"PASS {gid}: pad_vocab rounds up to the next multiple for {len(PAD_CASES)} cases, aligned ones included")


def check_masked_sampling(fn: Callable[..., Any]) -> None:
    """Check ``sample_next(logits, vocab_size, generator) -> (B, 1) int64``: samples from the softmax
    of the logits of real ids only. Run on a seeded untrained GPT with padded vocab whose padded
    rows are made the most likely ids, so only masking keeps them out; the samples must also vary.

    Raises:
        AssertionError: with a hint.
    """
    import torch

    from helpers.model import GPT, GPTConfig

    gid = "ch07_masked_sampling"
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=16, vocab_size=100, vocab_multiple=64, n_layer=1, n_head=2, n_embd=16)
    model = GPT(cfg).eval()
    with torch.no_grad():  # make the padded ids by far the most likely: only masking keeps them out
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)
        model.lm_head.weight[100:] = 1.0
        logits, _ = model(torch.zeros(8, 4, dtype=torch.long))
    logits = logits[:, -1, :]  # (8, 128)
    if logits.argmax(dim=-1).max() < 100:
        raise AssertionError("internal: the padded ids are not the most likely ones")
    g = torch.Generator().manual_seed(0)
    samples = [fn(logits.clone(), 100, g) for _ in range(25)]
    if any(s is None for s in samples):
        raise AssertionError(f"sample_next returned None. {_reread(gid)}")
    ids = torch.cat([torch.as_tensor(s).reshape(-1) for s in samples])
    if ids.max().item() >= 100:
        raise AssertionError(
            f"sample_next returned id {ids.max().item()} >= vocab_size = 100: padded ids must get logit -inf (or be "
            f"sliced off) before sampling. {_reread(gid)}")
    if ids.unique().numel() < 10:
        raise AssertionError(
            f"only {ids.unique().numel()} distinct ids in {ids.numel()} draws: sample with torch.multinomial from the "
            f"softmax, not argmax. {_reread(gid)}")
    print(f"PASS {gid}: {ids.numel()} samples from a padded untrained model, none >= vocab_size, {ids.unique().numel()} distinct ids")


def _attention_manual(q, k, v):
    from helpers import attention

    return attention.manual_attention(q, k, v)


def _attention_not_causal(q, k, v):
    import torch

    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _attention_mask_tensor(q, k, v):
    import torch

    T = q.size(-2)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _tiles_concatenate(s1, v1, s2, v2):
    import torch

    return torch.cat([s1, s2], dim=1).softmax(dim=1) @ torch.cat([v1, v2])


def _tiles_no_rescale(s1, v1, s2, v2):
    import torch

    m1 = s1.amax(dim=1, keepdim=True)
    p1 = torch.exp(s1 - m1)
    m = torch.maximum(m1, s2.amax(dim=1, keepdim=True))
    p2 = torch.exp(s2 - m)
    return (p1 @ v1 + p2 @ v2) / (p1.sum(1, keepdim=True) + p2.sum(1, keepdim=True))  # p1 not rescaled


def _tiles_no_max(s1, v1, s2, v2):
    import torch

    p1, p2 = torch.exp(s1), torch.exp(s2)
    return (p1 @ v1 + p2 @ v2) / (p1.sum(1, keepdim=True) + p2.sum(1, keepdim=True))


def _pad_always_add(n, m):
    return n + m - n % m


def _pad_round_down(n, m):
    return n // m * m


def _pad_next_always(n, m):
    return (n // m + 1) * m


def _sample_unmasked(logits, vocab_size, generator):
    import torch

    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


def _sample_off_by_one(logits, vocab_size, generator):
    import torch

    logits[:, vocab_size + 1 :] = float("-inf")
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


def _sample_argmax(logits, vocab_size, generator):
    return logits[:, :vocab_size].argmax(dim=-1, keepdim=True)


# --------------------------------------------------------------------------------------------
# Chapter 04 (checks ready; the notebook is not written yet)
# --------------------------------------------------------------------------------------------


class _SpyScaler:
    """Wraps a GradScaler and records which of its methods the learner called."""

    def __init__(self, scaler):
        self._scaler, self.calls = scaler, []

    def __getattr__(self, name):
        attr = getattr(self._scaler, name)
        if callable(attr):
            def spy(*args, **kwargs):
                self.calls.append(name)
                return attr(*args, **kwargs)
            return spy
        return attr


def _tiny_gpt():
    import torch

    from helpers.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=128, n_layer=1, n_head=2, n_embd=32))
    x = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(2))
    return model, x, y


def check_autocast_step(fn: Callable[..., Any]) -> None:
    """Check ``autocast_step(model, optimizer, x, y, dtype, scaler=None) -> (logits, loss)`` on a tiny
    GPT on the CPU: logits in the autocast dtype, master weights still fp32, loss within 2% of the fp32
    loss, the weights updated; with fp16 the GradScaler's scale/step/update are used.

    Raises:
        AssertionError: with a hint.
    """
    import torch

    gid = "ch04_autocast_step"
    for dtype in (torch.bfloat16, torch.float16):
        model, x, y = _tiny_gpt()
        with torch.no_grad():
            _, ref_loss = model(x, y)
        before = model.transformer.h[0].mlp.c_fc.weight.detach().clone()
        # the true gradient of this step, computed independently on a copy
        ref_model = copy.deepcopy(model)
        with torch.autocast(device_type=x.device.type, dtype=dtype):
            _, ref_step_loss = ref_model(x, y)
        ref_step_loss.backward()
        ref_grad = ref_model.transformer.h[0].mlp.c_fc.weight.grad
        for p in model.parameters():  # stale gradients of an earlier step: the step must clear them first
            p.grad = torch.full_like(p, 1e3)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = _SpyScaler(torch.amp.GradScaler("cpu")) if dtype is torch.float16 else None
        out = fn(model, opt, x, y, dtype, scaler)
        if not isinstance(out, tuple) or len(out) != 2:
            raise AssertionError(f"autocast_step must return (logits, loss). {_reread(gid)}")
        logits, loss = out
        name = str(dtype).replace("torch.", "")
        if logits.dtype != dtype:
            raise AssertionError(
                f"with dtype={name} the logits came out in {logits.dtype}: run the forward pass inside "
                f"torch.autocast(device_type=x.device.type, dtype=dtype). {_reread(gid)}")
        wrong = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
        if wrong:
            raise AssertionError(
                f"parameters are now {wrong}: keep the master weights in fp32 (autocast casts per operation; "
                f"never call model.to({name})). {_reread(gid)}")
        loss_value, ref_value = float(torch.as_tensor(loss).detach()), float(ref_loss)
        rel = abs(loss_value - ref_value) / ref_value
        if rel > 0.02:
            raise AssertionError(f"loss {loss_value:.4f} vs fp32 {ref_value:.4f} ({100 * rel:.1f}% apart). {_reread(gid)}")
        if torch.equal(before, model.transformer.h[0].mlp.c_fc.weight.detach()):
            raise AssertionError(f"the weights did not change: call the optimizer step. {_reread(gid)}")
        grad = model.transformer.h[0].mlp.c_fc.weight.grad
        if grad is not None and grad.abs().max() > 0 and (grad.float() - ref_grad).abs().max() > 1e-2 * ref_grad.abs().max() + 1.0:
            raise AssertionError(
                f"the gradients after the step hold more than this step's gradient (stale gradients of an earlier "
                f"step were added to it): call optimizer.zero_grad(set_to_none=True) before backward. {_reread(gid)}")
        if scaler is not None:
            missing = [m for m in ("scale", "step", "update") if m not in scaler.calls]
            if missing:
                raise AssertionError(
                    f"with fp16 the GradScaler's {missing} were not called: backward on scaler.scale(loss), then "
                    f"scaler.step(optimizer) and scaler.update(). {_reread(gid)}")
    print(f"PASS {gid}: bf16 and fp16 (+ GradScaler) steps: logits in the autocast dtype, fp32 master weights, loss within 2% of fp32")


CAPABILITY_CASES = [  # Volta, Turing, Ampere (A100, A10/RTX 30), Ada, Hopper, Blackwell (B200, RTX 50)
    ((7, 0), "float16"), ((7, 5), "float16"), ((8, 0), "bfloat16"), ((8, 6), "bfloat16"), ((8, 9), "bfloat16"),
    ((9, 0), "bfloat16"), ((10, 0), "bfloat16"), ((12, 0), "bfloat16"),
]


def check_autocast_dtype(fn: Callable[..., Any]) -> None:
    """Check ``pick_autocast_dtype(capability) -> torch.dtype | None``: fp16 below compute capability
    8.0 (no native bf16), bf16 from 8.0; for a CPU (``None``) bf16 or None are both accepted.

    Raises:
        AssertionError: with a hint.
    """
    import torch

    gid = "ch04_autocast_dtype"
    for cap, want in CAPABILITY_CASES:
        got = fn(cap)
        if got is not getattr(torch, want):
            why = ("bf16 needs compute capability >= 8.0; below it, use fp16 with a GradScaler"
                   if want == "float16" else "from compute capability 8.0 bf16 is native and needs no loss scaling")
            raise AssertionError(f"pick_autocast_dtype({cap}) returned {got}, expected torch.{want}: {why}. {_reread(gid)}")
    cpu = fn(None)
    if cpu not in (None, torch.bfloat16):
        raise AssertionError(f"pick_autocast_dtype(None) (a CPU) returned {cpu}: use torch.bfloat16 or None (fp32). {_reread(gid)}")
    print(f"PASS {gid}: fp16 below sm80, bf16 from sm80, CPU -> {cpu}")


def _step_weights_to_low_precision(model, optimizer, x, y, dtype, scaler=None):
    model.to(dtype)
    logits, loss = model(x, y)
    loss.backward()
    optimizer.step()
    return logits, loss


def _step_without_autocast(model, optimizer, x, y, dtype, scaler=None):
    logits, loss = model(x, y)
    loss.backward()
    optimizer.step()
    return logits, loss


def _step_fp16_without_scaler(model, optimizer, x, y, dtype, scaler=None):
    import torch

    with torch.autocast(device_type=x.device.type, dtype=dtype):
        logits, loss = model(x, y)
    loss.backward()
    optimizer.step()
    return logits, loss


def _step_without_zero_grad(model, optimizer, x, y, dtype, scaler=None):
    import torch

    with torch.autocast(device_type=x.device.type, dtype=dtype):
        logits, loss = model(x, y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return logits, loss


def _dtype_always_bf16(capability):
    import torch

    return torch.bfloat16


def _dtype_known_generations_only(capability):
    import torch

    return torch.bfloat16 if capability is not None and capability[0] in (8, 9) else torch.float16


def _dtype_trusts_is_bf16_supported(capability):
    import torch

    return torch.bfloat16 if capability is None or capability >= (7, 0) else torch.float16


CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = {
    "ch00_matmul_flops": check_matmul_flops,
    "ch00_tflops": check_tflops,
    "ch01_loss_at_init": check_loss_at_init,
    "ch01_block_params": check_block_params,
    "ch02_step_timer": check_step_timer,
    "ch02_mfu": check_mfu,
    "ch03_adamw_bytes": check_adamw_bytes,
    "ch03_batch_probe": check_batch_probe,
    "ch06_sdpa_attention": check_sdpa_attention,
    "ch06_online_softmax": check_online_softmax,
    "ch07_pad_vocab": check_pad_vocab,
    "ch07_masked_sampling": check_masked_sampling,
    "ch04_autocast_step": check_autocast_step,
    "ch04_autocast_dtype": check_autocast_dtype,
}


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


def _loss_log10(vocab_size: int) -> float:
    return math.log10(vocab_size)


def _loss_log2(vocab_size: int) -> float:
    return math.log2(vocab_size)


def _loss_probability(vocab_size: int) -> float:
    return 1.0 / vocab_size


def _loss_negative(vocab_size: int) -> float:
    return -math.log(vocab_size)


def _block_weights_only(n_embd: int) -> int:
    return 12 * n_embd * n_embd


def _block_forgot_layernorm(n_embd: int) -> int:
    return 12 * n_embd * n_embd + 9 * n_embd


def _block_layernorm_without_bias(n_embd: int) -> int:
    return 12 * n_embd * n_embd + 11 * n_embd


def _block_attention_only(n_embd: int) -> int:
    return 4 * n_embd * n_embd + 4 * n_embd + 2 * n_embd


def _block_mlp_hidden_c(n_embd: int) -> int:
    return 6 * n_embd * n_embd + 13 * n_embd


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
    "ch01_loss_at_init": [_loss_log10, _loss_log2, _loss_probability, _loss_negative],
    "ch01_block_params": [
        _block_weights_only,
        _block_forgot_layernorm,
        _block_layernorm_without_bias,
        _block_attention_only,
        _block_mlp_hidden_c,
    ],
    "ch02_step_timer": [_timer_no_sync, _timer_includes_warmup, _timer_no_sync_after_warmup],
    "ch02_mfu": [_mfu_ms_as_s, _mfu_percent],
    "ch03_adamw_bytes": [_adamw_one_moment, _adamw_with_params_and_grads],
    "ch03_batch_probe": [_probe_retry_inside_except, _probe_keeps_exception, _probe_doubling_only],
    "ch06_sdpa_attention": [_attention_manual, _attention_not_causal, _attention_mask_tensor],
    "ch06_online_softmax": [_tiles_concatenate, _tiles_no_rescale, _tiles_no_max],
    "ch07_pad_vocab": [_pad_always_add, _pad_round_down, _pad_next_always],
    "ch07_masked_sampling": [_sample_unmasked, _sample_off_by_one, _sample_argmax],
    "ch04_autocast_step": [_step_weights_to_low_precision, _step_without_autocast, _step_fp16_without_scaler,
                           _step_without_zero_grad],
    "ch04_autocast_dtype": [_dtype_always_bf16, _dtype_trusts_is_bf16_supported, _dtype_known_generations_only],
}


# Chapters after 07 keep their checks in their own module, ``helpers/checks_chNN.py``, which
# defines ``SECTIONS``, ``CHECKS`` and ``WRONG_ANSWERS`` exactly like the dicts above (and never
# imports this module at import time). They are merged here, so ``grading.check_x`` and the three
# dicts cover every chapter. A module already imported is reloaded, so the grader's fresh import
# (FRESH_CHECKS_PRELUDE) also undoes a submission that patched a chapter module.
def _chapter_check_modules() -> list[str]:
    import pkgutil

    import helpers

    return sorted(f"helpers.{m.name}" for m in pkgutil.iter_modules(helpers.__path__) if m.name.startswith("checks_ch"))


def _merge_chapter_checks() -> None:
    import importlib

    for name in _chapter_check_modules():
        module = sys.modules.get(name)
        module = importlib.reload(module) if module is not None else importlib.import_module(name)
        for table, extra in ((SECTIONS, module.SECTIONS), (CHECKS, module.CHECKS), (WRONG_ANSWERS, module.WRONG_ANSWERS)):
            clash = set(table) & set(extra)
            if clash:
                raise RuntimeError(f"{name} redefines grade ids {sorted(clash)}")
            table.update(extra)
        for check in module.CHECKS.values():
            globals()[check.__name__] = check


_merge_chapter_checks()


# --------------------------------------------------------------------------------------------
# 2. nbgrader's notebook format and student versions
# --------------------------------------------------------------------------------------------

CODE_STUB = '# YOUR CODE HERE\nraise NotImplementedError("Write this function: see the exercise text above")'
TEXT_STUB = "YOUR ANSWER HERE"
_BEGIN = re.compile(r"^\s*#+\s*BEGIN SOLUTION\b")
_END = re.compile(r"^\s*#+\s*END SOLUTION\b")
_BEGIN_HIDDEN = re.compile(r"^\s*#+\s*BEGIN HIDDEN TESTS\b")
_END_HIDDEN = re.compile(r"^\s*#+\s*END HIDDEN TESTS\b")


class SolutionMarkerError(ValueError):
    """A notebook's ``BEGIN SOLUTION`` / ``END SOLUTION`` markers do not pair up."""


def nbgrader_metadata(cell: Any) -> dict[str, Any]:
    """The cell's ``metadata.nbgrader`` dict (empty when the cell is not an nbgrader cell)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def is_solution_cell(cell: Any) -> bool:
    """True for a cell the learner writes in (``solution: true``)."""
    return bool(nbgrader_metadata(cell).get("solution", False))


def is_check_cell(cell: Any) -> bool:
    """True for an autograded check cell: ``grade: true, solution: false``, a code cell."""
    meta = nbgrader_metadata(cell)
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


def check_cells(nb: Any) -> dict[str, tuple[int, float]]:
    """``{grade_id: (cell index, points)}`` for every check cell of ``nb``, in notebook order."""
    found: dict[str, tuple[int, float]] = {}
    for index, cell in enumerate(nb.cells):
        if is_check_cell(cell):
            meta = nbgrader_metadata(cell)
            found[str(meta.get("grade_id", f"cell-{index}"))] = (
                index,
                float(meta.get("points", 0)),
            )
    return found


def has_exercises(nb: Any) -> bool:
    """True when any cell carries nbgrader metadata or a solution marker."""
    return any(
        nbgrader_metadata(cell) or any(_BEGIN.match(line) for line in cell.source.splitlines())
        for cell in nb.cells
    )


def _where(name: str, index: int, cell: Any) -> str:
    gid = nbgrader_metadata(cell).get("grade_id")
    return f"{name}, cell {index + 1}" + (f" (grade_id {gid!r})" if gid else "")


def _replace_regions(
    lines: list[str], begin: re.Pattern[str], end: re.Pattern[str], stub: str | None, where: str
) -> tuple[list[str], bool]:
    """Replace each begin..end region (markers included) by ``stub`` indented like its begin line.

    ``stub=None`` deletes the region. Returns the new lines and whether any region was found.
    Raises SolutionMarkerError when the markers do not pair up.
    """
    out: list[str] = []
    begin_line: int | None = None
    found = False
    for number, line in enumerate(lines, start=1):
        if begin.match(line):
            if begin_line is not None:
                raise SolutionMarkerError(
                    f"{where}: line {number} opens a region while the one opened on line {begin_line} "
                    f"is still open ({line.strip()!r}). Add the missing END marker."
                )
            begin_line = number
            found = True
            if stub is not None:
                indent = line[: len(line) - len(line.lstrip())]
                out.extend(indent + stub_line for stub_line in stub.splitlines())
        elif end.match(line):
            if begin_line is None:
                raise SolutionMarkerError(
                    f"{where}: line {number} ({line.strip()!r}) closes a region that was never opened. "
                    "Add the missing BEGIN marker or delete this line."
                )
            begin_line = None
        elif begin_line is None:
            out.append(line)
    if begin_line is not None:
        raise SolutionMarkerError(
            f"{where}: the region opened on line {begin_line} is never closed. Add the END marker."
        )
    return out, found


def student_version(nb: Any, name: str = "notebook") -> Any:
    """A copy of ``nb`` as learners get it (nbgrader's ``generate_assignment``, without nbgrader).

    - every ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region becomes ``CODE_STUB`` (code) or
      ``TEXT_STUB`` (markdown), indented like the BEGIN line; a solution cell without markers is
      replaced whole, as nbgrader does;
    - ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` regions are deleted;
    - outputs, execution counts, execution timings and saved widget state are cleared;
    - nbgrader metadata is kept, so the grader can find the check cells.

    Args:
        nb: an nbformat v4 notebook (not modified).
        name: shown in error messages (e.g. the file name).
    Raises:
        SolutionMarkerError: naming the notebook and cell whose markers do not pair up.
    """
    student = copy.deepcopy(nb)
    for index, cell in enumerate(student.cells):
        where = _where(name, index, cell)
        stub = TEXT_STUB if cell.cell_type == "markdown" else CODE_STUB
        lines, replaced = _replace_regions(cell.source.splitlines(), _BEGIN, _END, stub, where)
        lines, _ = _replace_regions(lines, _BEGIN_HIDDEN, _END_HIDDEN, None, where)
        if is_solution_cell(cell) and not replaced:
            lines = stub.splitlines()
        cell.source = "\n".join(lines)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
        if "attachments" in cell and is_solution_cell(cell):
            del cell["attachments"]
    student.metadata.pop("widgets", None)
    return student


def _notebooks_in(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is neither a notebook nor a folder of notebooks.")
    return sorted(p for p in path.glob("*.ipynb") if not p.name.startswith("."))


def make_student(source: Path, out: Path) -> list[Path]:
    """Write the student version of every exercise notebook in ``source`` to ``out``.

    ``source`` is a folder (its ``*.ipynb``, not recursive) or one notebook. Notebooks without any
    nbgrader cell are skipped (said on stdout): they have nothing to hide. Nothing else is copied.

    Returns:
        The written paths.
    Raises:
        FileNotFoundError: when ``source`` does not exist.
        ValueError: when ``out`` is the source folder (it would overwrite the solutions).
        SolutionMarkerError: on unbalanced markers (nothing is written for that notebook).
    """
    import nbformat

    notebooks = _notebooks_in(source)
    source_dir = source if source.is_dir() else source.parent
    if out.resolve() == source_dir.resolve():
        raise ValueError(
            f"--out {out} is the folder of the solution notebooks; choose another folder."
        )
    written = []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        if not has_exercises(nb):
            print(f"skipped {path} (no nbgrader cells)")
            continue
        student = student_version(nb, name=str(path))
        nbformat.validate(student)
        out.mkdir(parents=True, exist_ok=True)
        target = out / path.name
        nbformat.write(student, target)
        print(f"wrote {target} ({len(check_cells(student))} graded cells)")
        written.append(target)
    return written


# --------------------------------------------------------------------------------------------
# 3. Executing notebooks and grading submissions
# --------------------------------------------------------------------------------------------

# Prepended to every check cell when grading: re-executes helpers.grading in the kernel so that
# checks a submission replaced are restored (a limit, not a sandbox: grade untrusted code in a container).
FRESH_CHECKS_PRELUDE = "import importlib as _il, helpers.grading as _hg; grading = _il.reload(_hg)\n"

TIMEOUT_ENAME = "CellTimeoutError"
REPO_ROOT = Path(__file__).resolve().parents[1]  # the folder that holds helpers/


@dataclass
class CellRun:
    """What happened to one code cell: status is ``ok``, ``error``, ``timeout`` or ``not run``."""

    index: int  # 0-based position in the notebook
    status: str
    ename: str = ""
    evalue: str = ""


@dataclass
class NotebookRun:
    """The result of :func:`execute_notebook`: one CellRun per code cell, and kernel events."""

    cells: dict[int, CellRun] = field(default_factory=dict)
    kernel_died_in: int | None = None  # 0-based index of the cell during which the kernel died
    stuck_after_timeout_in: int | None = None  # a timeout the interrupt could not end
    startup_error: str | None = None  # the kernel never started


def _kernel_manager_class() -> type:
    """An AsyncKernelManager that always launches ipykernel with *this* Python interpreter.

    A ``python3`` kernelspec installed elsewhere (another conda env, ~/.local) would otherwise run
    the submissions with a different torch, or without ``helpers``.
    """
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager

    class CurrentPythonKernelManager(AsyncKernelManager):
        @property
        def kernel_spec(self) -> KernelSpec:  # type: ignore[override]
            if self._kernel_spec is None:
                self._kernel_spec = KernelSpec(
                    argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    display_name=f"Python {sys.version_info.major}.{sys.version_info.minor} (grader)",
                    language="python",
                    resource_dir="",
                )
            return self._kernel_spec

    return CurrentPythonKernelManager


def kernel_env() -> dict[str, str]:
    """The kernel's environment: ours, with the repository root first on PYTHONPATH.

    So ``import helpers`` works in the kernel whether or not the course is pip-installed.
    """
    env = dict(os.environ)
    parts = [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def execute_notebook(nb: Any, cwd: Path, timeout: int = 600) -> NotebookRun:
    """Run every code cell of ``nb`` (in place) in a fresh kernel; never raises for the notebook's faults.

    Errors are allowed (later cells still run). A cell running longer than ``timeout`` seconds is
    interrupted (KeyboardInterrupt in the kernel) and recorded as ``timeout``; when the kernel does
    not answer after that, the remaining cells are ``not run``. A dying kernel (``os._exit``, out of
    memory) ends the run, and the remaining cells are ``not run``.

    Args:
        nb: nbformat v4 notebook; outputs are replaced by this run's.
        cwd: the kernel's working folder (the notebook's folder).
        timeout: seconds per cell.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    run = NotebookRun()
    replies: dict[int, dict[str, Any]] = {}

    def on_cell_executed(cell: Any, cell_index: int, execute_reply: dict[str, Any] | None) -> None:
        if execute_reply is not None:
            replies[cell_index] = execute_reply.get("content", {})

    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        kernel_manager_class=_kernel_manager_class(),
        allow_errors=True,
        interrupt_on_timeout=True,
        error_on_timeout={
            "ename": TIMEOUT_ENAME,
            "evalue": f"timeout after {timeout} s",
            "traceback": [],
        },
        record_timing=False,
        resources={"metadata": {"path": str(cwd)}},
        on_cell_executed=on_cell_executed,
    )
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    for i in code_cells:
        run.cells[i] = CellRun(i, "not run")
    try:
        with client.setup_kernel(env=kernel_env()):
            for i in code_cells:
                try:
                    client.execute_cell(nb.cells[i], i)
                except DeadKernelError:
                    run.kernel_died_in = i
                    break
                except CellTimeoutError:  # not expected with interrupt_on_timeout; be safe
                    run.cells[i] = CellRun(i, "timeout")
                    run.stuck_after_timeout_in = i
                    break
                reply = replies.get(i, {})
                if reply.get("status") == "error" and reply.get("ename") == TIMEOUT_ENAME:
                    run.cells[i] = CellRun(i, "timeout")
                    if not _kernel_answers(client, min(timeout, 30)):
                        run.stuck_after_timeout_in = i
                        break
                elif reply.get("status") == "error":
                    run.cells[i] = CellRun(
                        i, "error", str(reply.get("ename", "")), str(reply.get("evalue", ""))
                    )
                else:
                    run.cells[i] = CellRun(i, "ok")
    except DeadKernelError:
        run.kernel_died_in = run.kernel_died_in if run.kernel_died_in is not None else -1
    except Exception as exc:  # kernel could not start, or the client broke: report, never crash
        if not any(c.status != "not run" for c in run.cells.values()):
            run.startup_error = f"{type(exc).__name__}: {_first_line(str(exc))}"
        elif run.kernel_died_in is None:
            run.kernel_died_in = -1
    return run


def _kernel_answers(client: Any, timeout: int) -> bool:
    """After an interrupted timeout: does the kernel run a trivial cell within ``timeout`` s?"""
    import nbformat

    probe = nbformat.v4.new_code_cell("pass")
    saved = client.timeout
    client.timeout = timeout
    try:
        reply: dict[str, Any] = {}
        hook = client.on_cell_executed
        client.on_cell_executed = lambda cell, cell_index, execute_reply: reply.update(
            (execute_reply or {}).get("content", {})
        )
        try:
            client.execute_cell(probe, -1, store_history=False)
        finally:
            client.on_cell_executed = hook
        return reply.get("status") == "ok"
    except Exception:
        return False
    finally:
        client.timeout = saved


def _first_line(text: str, limit: int = 200) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass
class Reference:
    """One solution notebook: its graded cells, their points and their check code."""

    path: Path
    points: dict[str, float]  # grade_id -> points, in notebook order
    sources: dict[str, str]  # grade_id -> the check cell's code (hidden tests included)


def load_references(folder: Path) -> dict[str, Reference]:
    """``{file name: Reference}`` for every notebook in ``folder`` with at least one check cell.

    Raises:
        FileNotFoundError: when ``folder`` holds no such notebook.
    """
    import nbformat

    refs = {}
    for path in _notebooks_in(folder):
        nb = nbformat.read(path, as_version=4)
        cells = check_cells(nb)
        if cells:
            refs[path.name] = Reference(
                path,
                {gid: pts for gid, (_, pts) in cells.items()},
                {gid: nb.cells[i].source for gid, (i, _) in cells.items()},
            )
    if not refs:
        raise FileNotFoundError(
            f"No notebook in {folder} has graded cells (nbgrader metadata with grade: true). "
            "Pass the folder of the solution notebooks with --reference."
        )
    return refs


COLUMNS = ["student", "notebook", "grade_id", "points", "max_points", "status", "reason"]


def _row(
    student: str, notebook: str, gid: str, pts: float, max_pts: float, status: str, reason: str
) -> dict[str, Any]:
    return dict(
        zip(
            COLUMNS,
            [student, notebook, gid, _fmt(pts), _fmt(max_pts), status, reason],
            strict=False,
        )
    )


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def grade_notebook(path: Path, ref: Reference, student: str, timeout: int) -> list[dict[str, Any]]:
    """Execute one submission and return one CSV row per graded cell of its reference.

    The check cells' code is restored from the reference before running (as ``nbgrader autograde``
    does), so an edited check cannot pass; points always come from the reference.
    """
    import nbformat

    name = ref.path.name
    rows = lambda status, reason: [  # noqa: E731 - every graded cell gets the same verdict
        _row(student, name, gid, 0, pts, status, reason) for gid, pts in ref.points.items()
    ]
    try:
        nb = nbformat.read(path, as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("no list of cells")
    except Exception as exc:
        return rows("error", f"notebook unreadable: {type(exc).__name__}: {_first_line(str(exc))}")

    where: dict[str, int] = {}  # grade_id -> index of the student's (last) check cell
    for index, cell in enumerate(nb.cells):
        gid = nbgrader_metadata(cell).get("grade_id")
        if gid in ref.points and is_check_cell(cell):
            # The reference's check code, run against a freshly re-executed helpers.grading: a
            # submission that reassigned grading.check_* (or the name `grading`) cannot pass that way.
            cell.source = FRESH_CHECKS_PRELUDE + ref.sources[gid]
            where[gid] = index
    run = execute_notebook(nb, cwd=path.parent, timeout=timeout)

    out = []
    for gid, pts in ref.points.items():
        index = where.get(gid)
        if run.startup_error:
            status, reason = "error", f"kernel failed to start: {run.startup_error}"
        elif index is None:
            status, reason = "missing", "check cell missing (deleted or metadata lost)"
        else:
            status, reason = _verdict(run, index, timeout, frozenset(where.values()))
        out.append(_row(student, name, gid, pts if status == "passed" else 0, pts, status, reason))
    return out


def _broke(cell: CellRun) -> bool:
    """A cell that failed for a reason other than an exercise's expected failure."""
    expected = ("AssertionError", "NotImplementedError")
    return cell.status == "timeout" or (cell.status == "error" and cell.ename not in expected)


def _verdict(
    run: NotebookRun, index: int, timeout: int, check_indices: frozenset[int] = frozenset()
) -> tuple[str, str]:
    """(status, reason) of the check cell at ``index``; ``check_indices`` are never blamed as the cause."""
    cell = run.cells.get(index, CellRun(index, "not run"))
    k = index + 1  # cells are counted from 1, markdown included, as a reader counts them
    if cell.status == "ok":
        return "passed", "passed"
    if cell.status == "timeout":
        return "failed", f"timeout after {timeout} s in cell {k}"
    if cell.status == "error":
        if cell.ename == "NotImplementedError":
            return "failed", "NotImplementedError: not attempted"
        reason = f"{cell.ename}: {_first_line(cell.evalue)}" if cell.evalue else cell.ename
        if cell.ename != "AssertionError":  # e.g. a NameError: say which earlier cell broke first
            earlier = [
                c
                for i, c in sorted(run.cells.items())
                if i < index and i not in check_indices and _broke(c)
            ]
            if earlier:
                first = earlier[-1]
                what = "timed out" if first.status == "timeout" else f"raised {first.ename}"
                reason += f" (cell {first.index + 1} {what} before)"
        return "failed", reason
    if run.kernel_died_in is not None:
        at = f" in cell {run.kernel_died_in + 1}" if run.kernel_died_in >= 0 else ""
        return "failed", f"kernel died{at}"
    if run.stuck_after_timeout_in is not None:
        return (
            "failed",
            f"timeout after {timeout} s in cell {run.stuck_after_timeout_in + 1} (kernel did not recover)",
        )
    return "error", "cell not run"


def _match_reference(path: Path, refs: dict[str, Reference]) -> Reference | None:
    """The reference with the same file name, else the one sharing most grade ids (renamed files)."""
    if path.name in refs:
        return refs[path.name]
    try:
        import nbformat

        ids = set(check_cells(nbformat.read(path, as_version=4)))
    except Exception:
        return None
    best = max(refs.values(), key=lambda r: len(ids & set(r.points)))
    return best if ids & set(best.points) else None


def _submitted_notebooks(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*.ipynb")
        if ".ipynb_checkpoints" not in p.parts and not p.name.startswith(".")
    )


def grade(submissions: Path, reference: Path, timeout: int = 600) -> list[dict[str, Any]]:
    """Grade every student folder in ``submissions``; return the CSV rows (see ``COLUMNS``).

    Layout: ``submissions/<student id>/<notebook>.ipynb`` (sub-folders below the student's are
    searched too, so nbgrader's ``submitted/<student>/<assignment>/`` works). A notebook is graded
    against the reference notebook of the same file name, or, when renamed, the one sharing most
    grade ids. A notebook that some students submitted and others did not gives the others
    ``missing`` rows. Nothing a submission does stops the grading of the others.

    Raises:
        FileNotFoundError: when ``submissions`` has no student folder, or ``reference`` no graded notebook.
    """
    refs = load_references(reference)
    if not submissions.is_dir():
        raise FileNotFoundError(f"{submissions} is not a folder of student folders.")
    for stray in sorted(submissions.glob("*.ipynb")):
        print(
            f"ignored {stray}: put each student's notebooks in {submissions}/<student id>/",
            file=sys.stderr,
        )
    students = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not students:
        raise FileNotFoundError(
            f"{submissions} has no student folders ({submissions}/<student id>/<notebook>.ipynb)."
        )

    chosen: dict[str, dict[str, Path]] = {}  # student -> reference name -> submitted file
    rows: list[dict[str, Any]] = []
    for folder in students:
        chosen[folder.name] = {}
        notebooks = _submitted_notebooks(folder)
        for path in notebooks:
            ref = _match_reference(path, refs)
            if ref is None:
                print(
                    f"ignored {path}: matches no reference notebook in {reference}", file=sys.stderr
                )
                continue
            current = chosen[folder.name].get(ref.path.name)
            if current is None or _prefer(path, current, ref):
                if current is not None:
                    print(
                        f"ignored {current}: {path} is graded as {ref.path.name} instead",
                        file=sys.stderr,
                    )
                chosen[folder.name][ref.path.name] = path
            else:
                print(
                    f"ignored {path}: {current} is graded as {ref.path.name} instead",
                    file=sys.stderr,
                )
        if not notebooks:
            rows.append(_row(folder.name, "", "", 0, 0, "missing", "no notebook submitted"))
    assignment = sorted({name for per_student in chosen.values() for name in per_student})

    for folder in students:
        for name in assignment:
            ref = refs[name]
            path = chosen[folder.name].get(name)
            if path is None:
                rows.extend(
                    _row(folder.name, name, g, 0, p, "missing", "notebook not submitted")
                    for g, p in ref.points.items()
                )
                continue
            print(f"grading {path} against {ref.path} ...", file=sys.stderr, flush=True)
            rows.extend(grade_notebook(path, ref, folder.name, timeout))
    return rows


def _prefer(new: Path, old: Path, ref: Reference) -> bool:
    """Of two files graded as the same notebook: the exact name wins, then the newer file."""
    if (new.name == ref.path.name) != (old.name == ref.path.name):
        return new.name == ref.path.name
    return new.stat().st_mtime > old.stat().st_mtime


def write_csv(rows: Iterable[dict[str, Any]], path: Path) -> None:
    """Write grading rows with the columns ``COLUMNS``."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def totals_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table: per student, points / max points and checks passed."""
    per: dict[str, list[float]] = {}
    for r in rows:
        t = per.setdefault(r["student"], [0.0, 0.0, 0, 0])
        t[0] += float(r["points"])
        t[1] += float(r["max_points"])
        t[2] += r["status"] == "passed"
        t[3] += bool(r["grade_id"])
    width = max([len("student")] + [len(s) for s in per])
    lines = [f"{'student':<{width}}  {'points':>12}  {'checks passed':>13}"]
    for student, (pts, max_pts, passed, checks) in per.items():
        lines.append(
            f"{student:<{width}}  {_fmt(pts) + ' / ' + _fmt(max_pts):>12}  {f'{passed} / {checks}':>13}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``make-student`` and ``grade`` (see docs/grading.md)."""
    parser = argparse.ArgumentParser(
        prog="python -m helpers.grading", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ms = sub.add_parser("make-student", help="write student versions of the exercise notebooks")
    ms.add_argument(
        "notebooks",
        nargs="?",
        default="notebooks",
        help="folder of solution notebooks, or one notebook (default: notebooks)",
    )
    ms.add_argument(
        "--out", default="student", help="folder for the student versions (default: student)"
    )
    gr = sub.add_parser("grade", help="execute and grade submissions/<student>/<notebook>.ipynb")
    gr.add_argument("submissions", help="folder with one sub-folder per student id")
    gr.add_argument("--out", default="grades.csv", help="CSV to write (default: grades.csv)")
    gr.add_argument("--timeout", type=int, default=600, help="seconds per cell (default: 600)")
    gr.add_argument(
        "--reference", default="notebooks", help="folder of solution notebooks (default: notebooks)"
    )
    args = parser.parse_args(argv)

    try:
        if args.command == "make-student":
            written = make_student(Path(args.notebooks), Path(args.out))
            print(f"{len(written)} student notebook(s) in {args.out}/")
        else:
            rows = grade(Path(args.submissions), Path(args.reference), timeout=args.timeout)
            write_csv(rows, Path(args.out))
            print(totals_table(rows))
            print(f"wrote {args.out} ({len(rows)} rows)")
    except (FileNotFoundError, ValueError) as exc:  # SolutionMarkerError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
