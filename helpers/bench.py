"""The course's measuring verb: build a RunConfig, time its training step, read its peak memory,
and return one row (measured, skipped with the reason, or failed with the error).

The ladder, the chapter modules and the benchmarks all measure a configuration through
:func:`measure`, so every number the course prints comes from the same steps: the
:class:`helpers.core.train.Trainer` step on real Tiny Shakespeare batches, timed by
:func:`helpers.measure.timing.measure` (warm-up steps excluded, CUDA events on a GPU, median of the
timed steps), peak memory from :func:`helpers.measure.memory.peak_bytes` since the build began.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import torch

from helpers.core import data
from helpers.core.model import GPTConfig, flops_per_token
from helpers.core.train import RunConfig, Trainer, build, slow_reason, unsupported_reason
from helpers.measure import hardware, memory, timing

# A hook sees the trainer and its batch loader and returns fields to add to the row.
Hook = Callable[[Trainer, data.BatchLoader], dict]


def skipped_row(run: RunConfig, reason: str | None) -> dict:
    """A row for ``run`` with status "skipped" and ``reason``; :func:`measure` fills in the rest.

    Keys: name, status, ms_per_step, tokens_per_s, speedup, mfu, peak_mem_bytes (bytes),
    first_step_ms, loss (nats), reason, switches (every RunConfig field but the name)."""
    return {
        "name": run.name,
        "status": "skipped",
        "ms_per_step": None,
        "tokens_per_s": None,
        "speedup": None,
        "mfu": None,
        "peak_mem_bytes": None,
        "first_step_ms": None,
        "loss": None,
        "reason": reason,
        "switches": {k: v for k, v in run.__dict__.items() if k not in ("name",)},
    }


def _out_of_memory_reason(run: RunConfig, device: torch.device) -> str:
    emulated = hardware.emulated_profile()
    if emulated is not None:
        where = f"under the emulated {emulated.key}'s memory cap"
    elif device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        where = f"on this GPU ({memory.format_bytes(total)})"
    else:
        where = "on this device"
    # torch's own message names the real GPU's free memory, which misleads under emulation
    return f"out of memory at B={run.batch_size} {where}: lower B, or see chapter 09"


def measure(
    run: RunConfig,
    model_config: GPTConfig,
    device: torch.device | str,
    tokens: torch.Tensor | None = None,
    warmup: int = 3,
    iters: int = 10,
    run_slow: bool = False,
    trainer: Trainer | None = None,
    loader: data.BatchLoader | None = None,
    before: Hook | None = None,
    after: Hook | None = None,
) -> dict:
    """Time ``iters`` training steps of ``run`` after ``warmup`` untimed ones; return one row.

    Args:
        run: the configuration; ``run.batch_size`` and ``run.seq_len`` give the batch (B, T).
        model_config: the model's shape (GPT-2 124M on a GPU, the small config on a CPU).
        device: where it runs.
        tokens: (N,) int64 token ids the batches are cut from (default: Tiny Shakespeare).
        warmup, iters: untimed and timed steps (the first warm-up step compiles a compiled run).
        run_slow: also time a run that is only slow here (bf16 on a CPU without fast bf16,
            :func:`helpers.core.train.slow_reason`); by default it is skipped with that reason.
        trainer: time this already built trainer (its ``run`` is what runs) instead of building one.
        loader: the batches (default: a new :class:`helpers.core.data.BatchLoader` over ``tokens``).
        before, after: hooks called with (trainer, loader) before the warm-up steps and after the
            timed steps; the dicts they return are added to the row (e.g. a loss curve recorded by
            training first, or a profile).

    Returns:
        The row of :func:`skipped_row` with status "measured" and: ms_per_step (median, ms),
        spread_pct, first_step_ms (the first warm-up step, ms: a compiled run's compile time is in
        it), tokens_per_s, mfu (None with the reason in ``reason`` where no datasheet peak applies),
        peak_mem_bytes (CUDA; None on a CPU), loss (last timed step, nats), timed_window_s
        (time.time() at the start and end of the timed steps, s); or status "skipped" (the reason
        the hardware cannot run it) or "failed" (out of memory, or the error's first line). A
        failure is reported, never replaced by another mode.
    """
    device = torch.device(device)
    run = trainer.run if trainer is not None else run
    reason = unsupported_reason(run, device)
    if reason is None and not run_slow:
        reason = slow_reason(run, device)
    row = skipped_row(run, reason)
    if reason is not None:
        return row
    own = trainer is None
    try:
        memory.reset_peak(device)
        if own:
            trainer = build(run, model_config, device)
        if loader is None:
            tokens = data.load_tokens() if tokens is None else tokens
            loader = data.BatchLoader(tokens, run.batch_size, run.seq_len, device)
        if before is not None:
            row.update(before(trainer, loader))
        losses = []
        t = timing.measure(
            lambda: losses.append(trainer.step(loader)), device, warmup=warmup, iters=iters
        )
        end = time.time()
        row["timed_window_s"] = [end - sum(t.times_ms) / 1e3, end]
        row["peak_mem_bytes"] = memory.peak_bytes(device)
        row["loss"] = float(losses[-1])
        row["first_step_ms"] = t.warmup_ms[0] if t.warmup_ms else None
        row["ms_per_step"] = t.median_ms
        row["spread_pct"] = t.spread_pct
        row["tokens_per_s"] = timing.tokens_per_second(run.tokens_per_step, t.median_ms)
        peak, peak_src = timing.peak_flops(device)
        row["mfu"], mfu_reason = timing.mfu(
            flops_per_token(model_config, run.seq_len), row["tokens_per_s"], peak
        )
        row["status"] = "measured"
        row["reason"] = "ok" if row["mfu"] is not None else f"MFU not reported: {mfu_reason}"
        if peak is not None:
            row["peak_source"] = peak_src
        if after is not None:
            row.update(after(trainer, loader))
    except torch.cuda.OutOfMemoryError:
        row["status"], row["reason"] = "failed", _out_of_memory_reason(run, device)
    except Exception as e:  # a configuration that breaks is reported, never faked
        first = str(e).splitlines()[0][:300] if str(e) else ""
        row["status"], row["reason"] = "failed", f"{type(e).__name__}: {first}"
    finally:
        if own:  # drop the model, optimizer and graphs before the next configuration
            trainer = None
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            torch._dynamo.reset()
    return row
