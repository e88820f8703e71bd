"""Peak-memory measurement for one device.

``torch.cuda.max_memory_allocated`` counts the bytes the caching allocator handed to tensors since
the last reset: the figure that decides whether a step fits. CPUs have no such counter in torch,
so on a CPU these functions return None rather than a made-up number.
"""

from __future__ import annotations

import gc

import torch


def reset_peak(device: torch.device | str) -> None:
    """Free cached blocks and start a new peak-memory window on ``device`` (no-op on CPU).

    On CUDA: ``gc.collect()`` (tensors held only by reference cycles, e.g. a failed step's
    traceback, are freed now, not at the next automatic collection), ``empty_cache()`` and
    ``reset_peak_memory_stats``. A CPU has no peak counter to reset and no cache to empty, so
    nothing runs there (a full collection in a large process takes a tenth of a second or more).
    """
    device = torch.device(device)
    if device.type == "cuda":
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: torch.device | str) -> int | None:
    """Peak bytes allocated to tensors on ``device`` since :func:`reset_peak`; None on CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def held_bytes(fn, device: torch.device | str) -> tuple[object, int]:
    """Run ``fn()`` and count the bytes it allocated on ``device`` that are still allocated when it
    returns: for a forward pass, the activations the autograd graph keeps for backward plus what
    ``fn`` returns (logits, loss), on any device. Tensors that existed before (the parameters) are
    not counted.

    CUDA: ``torch.cuda.memory_allocated`` after minus before. CPU (no allocator counter): the
    allocation (+bytes) and free (-bytes) events that
    ``torch.profiler.profile(profile_memory=True)`` records, summed over the top-level events only
    (an operator's memory figure already includes its children's). Returns (fn's result, bytes).
    Drop earlier results before calling: a tensor freed while ``fn`` runs counts negative.
    """
    device = torch.device(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        out = fn()
        torch.cuda.synchronize(device)
        return out, torch.cuda.memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    return out, sum(e.cpu_memory_usage for e in prof.events() if e.cpu_parent is None)


def format_bytes(n: int | None) -> str:
    """'11.52 GiB' style text (binary units); '-' for None."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


# --------------------------------------------------------------------------------------------
# Where the memory of one training step goes (chapter 03)
# --------------------------------------------------------------------------------------------


def activation_bytes_per_layer(
    B: int, T: int, n_embd: int, n_head: int, bytes_per_act: int, manual_attention: bool
) -> int:
    """Activation bytes one transformer block keeps for backward (no dropout, no recomputation).

    Adapted from Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models", section 4.1 (https://arxiv.org/abs/2205.05198): per layer s·b·h·34 + 5·a·s²·b bytes
    in 16-bit with dropout. Without dropout masks that is s·b·h·32 (16-bit) and, for the
    materialised (T, T) scores, 2 tensors (scores, softmax) of a·s²·b elements. ``bytes_per_act``
    is 2 for bf16/fp16 autocast, 4 for fp32. SDPA's fused kernels keep no (T, T) tensor.
    """
    sbh = T * B * n_embd
    per_layer = 16 * sbh * bytes_per_act  # 32 bytes at 16-bit -> 16 elements of s·b·h
    if manual_attention:
        per_layer += 2 * n_head * T * T * B * bytes_per_act
    return per_layer


def _param_count(config) -> int:
    """Parameters of ``GPT(config)`` (a tied LM head counted once), from the shapes alone: token
    embedding ``V_padded * C``, position embedding ``block_size * C``, per block ``12 C^2 + 13 C``
    (attention 4C^2 + 4C, MLP 8C^2 + 5C, two LayerNorms 4C) and the final LayerNorm ``2 C``."""
    C, L = config.n_embd, config.n_layer
    return (config.padded_vocab_size + config.block_size) * C + L * (12 * C * C + 13 * C) + 2 * C


def training_step_estimate(
    config, B: int, T: int, autocast: bool, manual_attention: bool = True
) -> dict[str, int]:
    """Estimated peak bytes of one training step of ``config`` (a GPTConfig) at batch B, length T.

    Parts (bytes): parameters and gradients (fp32, 4 B each), AdamW state (exp_avg and exp_avg_sq,
    fp32: 8 B per parameter), activations kept for backward (see
    :func:`activation_bytes_per_layer`), and the logits: B·T·V elements in the compute dtype, plus
    what the fp32 cross-entropy keeps and makes: its fp32 log-softmax output (saved for backward,
    4 B) and, during backward, the fp32 gradients of that output and of its input (8 B) — 14 B per
    logit under autocast, 16 B in fp32. The logits term was fitted to nothing: it counts the tensors
    of ``F.cross_entropy(logits.float())`` (the model's loss); on the H200 it brings the estimate
    from 62% to 97% of the measured peak of a bf16 + SDPA eager step at B=16, T=1024 (17.58 GiB
    measured, chapter 03).
    An estimate, not a measurement: chapter 03 compares it with ``torch.cuda.max_memory_allocated``.
    """
    n_params = _param_count(config)
    act = 2 if autocast else 4
    V = config.padded_vocab_size
    parts = {
        "parameters": 4 * n_params,
        "gradients": 4 * n_params,
        "adamw_state": 8 * n_params,
        "activations": config.n_layer
        * activation_bytes_per_layer(B, T, config.n_embd, config.n_head, act, manual_attention),
        "logits": B * T * V * (act + 4 + 8),
    }
    parts["total"] = sum(parts.values())
    return parts


# --------------------------------------------------------------------------------------------
# What is alive at the peak (chapter 14)
# --------------------------------------------------------------------------------------------


def block_saved_tensors(
    n_embd: int, autocast: bool, residual_bf16: bool = False
) -> list[tuple[str, int]]:
    """The tensors one transformer block keeps for backward in an eager step, as
    ``(what, bytes per token)``, counted from what each operator's backward needs (PyTorch's
    ``tools/autograd/derivatives.yaml``): a Linear keeps its input, GELU its input, LayerNorm its
    input and its mean and rstd, an add nothing. ``n_embd`` is C. Under autocast the matmuls read
    16-bit copies of their inputs (2 bytes), LayerNorm runs in fp32; the residual stream is fp32
    (4 bytes) unless ``residual_bf16``. The same list holds for manual attention (``q @ k^T`` and
    ``att @ v`` keep contiguous copies of q, k, v, and the attention output is copied by
    ``transpose().contiguous()``) and for SDPA (the kernel keeps the c_attn output its q, k, v
    views point into, and its output is already laid out as (B, T, nh, hs), so ``contiguous()``
    copies nothing); the (T, T) scores of manual attention are counted apart
    (:func:`peak_estimate`). Sum: fp32 64·C + 16 (16 numbers of C per token, Korthikanti et al.
    2022 without dropout), autocast 36·C + 16.
    """
    C, a, r = n_embd, (2 if autocast else 4), (2 if residual_bf16 else 4)
    return [
        ("ln_1 input (the residual stream)", r * C),
        ("ln_1 output, c_attn's input", a * C),
        ("q, k, v", 3 * a * C),
        ("attention output, the projection's input", a * C),
        ("ln_2 input (the residual stream)", r * C),
        ("ln_2 output, c_fc's input", a * C),
        ("c_fc output, GELU's input", 4 * a * C),
        ("GELU output, the MLP projection's input", 4 * a * C),
        ("LayerNorm mean and rstd (two LayerNorms, fp32)", 16),
    ]


def peak_estimate(
    config,
    B: int,
    T: int,
    autocast: bool,
    attention: str = "manual",
    residual_bf16: bool = False,
    checkpoint_every: int = 0,
    grads_kept: bool = False,
    first_step: bool = False,
    loss_kernel: str = "pytorch",
    optimizer: str = "foreach",
) -> dict[str, int]:
    """Bytes alive at the peak of one eager training step of ``config`` (a GPTConfig) at batch B,
    length T: chapter 14's estimate, built from what a memory snapshot shows holds the peak.

    Two moments compete. **The loss's backward**, before any parameter has a gradient: every
    activation the forward saved is alive, and so are the logits (in the compute dtype; the step's
    ``_, loss = forward(x, y)`` keeps them), the fp32 log-softmax output and, being made, the fp32
    gradients of the log-softmax's output and input: 16 bytes per logit in fp32, 14 under autocast.
    **The optimizer step**: parameters, gradients, AdamW state and the optimizer's temporaries.
    The returned parts are those of the larger moment (the optimizer's has no activations, scores
    or logits; the backward's no optimizer temporaries). Parts (bytes):

    - ``parameters``: 4 per parameter; ``adamw_state``: 8 per parameter (in the backward 0 with
      ``first_step``: AdamW creates its state in the first ``step()``, after the backward);
    - ``gradients``: in the backward 0 (``zero_grad(set_to_none=True)`` freed them), 4 per
      parameter with ``grads_kept`` (``zero_grad(set_to_none=False)`` zeroes them in place; every
      micro-step after the first of gradient accumulation adds to them); 4 per parameter in the
      optimizer step;
    - ``optimizer_temporaries``: foreach AdamW's ``_foreach_sqrt(exp_avg_sq)``, one fp32 number per
      parameter; the for-loop AdamW's largest such tensor (the V x C embedding); none for fused;
    - ``weight_copies``: under autocast, the 16-bit copy of every matmul weight that the Linear
      layers keep for backward (2 bytes each; none for a checkpointed block);
    - ``activations``: per block :func:`block_saved_tensors`; a checkpointed block
      (``checkpoint_every``: every k-th block, block policy) keeps only its input; plus ln_f's
      input and output;
    - ``attention_scores``: manual attention keeps the softmax output, (B, nh, T, T) in fp32
      (autocast runs softmax in fp32), and under autocast also its 16-bit copy for ``att @ v``;
    - ``logits``: B·T·V_padded · (compute-dtype bytes + 12).

    Checked against the committed H200 peaks of the eager steps (fp32, TF32, bf16 and fp16 with
    manual attention, bf16 + SDPA from B=1 to 138, checkpointing, gradient accumulation):
    tests/test_memory.py. Not counted: library workspaces and the allocator's rounding (the
    measured peaks are 0.1 GB above the estimate there), and what torch.compile changes.

    Raises:
        ValueError: a loss kernel other than "pytorch" (the Triton and fused losses keep other
            tensors: measure them), an unknown attention or optimizer.
    """
    if loss_kernel != "pytorch":
        raise ValueError(
            "peak_estimate models the PyTorch cross-entropy only, not "
            f"loss_kernel={loss_kernel!r}: measure that step's peak (chapter 14, section 5)"
        )
    if attention not in ("manual", "sdpa"):
        raise ValueError(f"attention must be 'manual' or 'sdpa', got {attention!r}")
    n_params = _param_count(config)
    C, L, V = config.n_embd, config.n_layer, config.padded_vocab_size
    # per implementation: the step's temporaries (bytes)
    temporaries = {"foreach": 4 * n_params, "for-loop": 4 * V * C, "fused": 0, "triton": 0}
    if optimizer not in temporaries:
        raise ValueError(f"optimizer must be one of {tuple(temporaries)}, got {optimizer!r}")
    tokens = B * T
    r = 2 if residual_bf16 else 4
    kept = [not (checkpoint_every and i % checkpoint_every == 0) for i in range(L)]
    per_block = sum(b for _, b in block_saved_tensors(C, autocast, residual_bf16))
    scores = config.n_head * T * T * B * ((4 + 2) if autocast else 4)
    parts = {
        "parameters": 4 * n_params,
        "gradients": 4 * n_params if grads_kept else 0,
        "adamw_state": 0 if first_step else 8 * n_params,
        "weight_copies": 2 * (12 * C * C * sum(kept) + V * C) if autocast else 0,
        "activations": tokens * (sum(per_block if k else r * C for k in kept) + r * C)
        + tokens * ((2 if autocast else 4) * C + 8),  # ln_f's output and its mean and rstd
        "attention_scores": scores * sum(kept) if attention == "manual" else 0,
        "logits": tokens * V * ((2 if autocast else 4) + 12),
        "optimizer_temporaries": 0,
    }
    step = dict.fromkeys(parts, 0)
    step.update(
        parameters=4 * n_params,
        gradients=4 * n_params,
        adamw_state=8 * n_params,
        optimizer_temporaries=temporaries[optimizer],
    )
    chosen = max(parts, step, key=lambda moment: sum(moment.values()))
    chosen["total"] = sum(chosen.values())
    return chosen


# --------------------------------------------------------------------------------------------
# Finding the largest batch that fits (chapter 03)
# --------------------------------------------------------------------------------------------


def is_oom(error: BaseException) -> bool:
    """True for a CUDA out-of-memory error (``torch.cuda.OutOfMemoryError``; also the plain
    RuntimeError text older PyTorch versions raise)."""
    return isinstance(error, torch.cuda.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower()
    )


def fits(try_step, B: int, device) -> tuple[bool, int | None]:
    """Run ``try_step(B)``; (True, peak bytes) if it fits (peak None on a CPU, which has no
    counter), (False, None) after a CUDA out-of-memory error, with the failed step's memory
    released; other errors are raised.

    The clean-up happens *outside* the ``except`` block: inside it, the exception's traceback still
    references the failed step's frames (its tensors), so nothing could be freed.
    """
    failed = False
    try:
        reset_peak(device)
        try_step(B)
        return True, peak_bytes(device)
    except Exception as e:  # noqa: BLE001 - only OOM is caught, everything else re-raised
        if not is_oom(e):
            raise
        failed = True
    if failed:  # out of the except block: the traceback and the step's tensors are gone now
        reset_peak(device)  # on CUDA: gc.collect() + empty_cache() + new peak window
    return False, None


def find_max_batch_size(
    try_step, device, start: int = 1, limit: int = 4096, margin: float = 0.0
) -> dict:
    """Largest batch size B for which ``try_step(B)`` (a *full* training step: forward, backward,
    optimizer) runs without CUDA OOM: double from ``start`` until a failure, then bisect.

    ``try_step(B)`` must keep no reference to its tensors after it returns or raises.
    ``margin`` (0..1) shrinks the answer for safety: B_safe = floor(B_max · (1 - margin)).
    Returns {"max_batch_size", "safe_batch_size", "peak_mem_bytes", "tried": [(B, fits, peak)]}.

    Raises:
        RuntimeError: if even B = ``start`` does not fit (lower T, use a smaller model or
            activation checkpointing).
    """
    tried = []

    def probe(B):
        ok, peak = fits(try_step, B, device)
        tried.append((B, ok, peak))
        return ok, peak

    ok, peak = probe(start)
    if not ok:
        raise RuntimeError(
            f"not even B={start} fits on {device}: lower T, or use activation checkpointing"
        )
    good, good_peak, bad = start, peak, None
    while bad is None and good < limit:
        B = min(2 * good, limit)
        ok, peak = probe(B)
        if ok:
            good, good_peak = B, peak
        else:
            bad = B
    while bad is not None and bad - good > 1:
        B = (good + bad) // 2
        ok, peak = probe(B)
        if ok:
            good, good_peak = B, peak
        else:
            bad = B
    return {
        "max_batch_size": good,
        "safe_batch_size": max(1, int(good * (1 - margin))),
        "peak_mem_bytes": good_peak,
        "tried": tried,
    }


class SimulatedMemoryLimit:
    """A memory budget for machines without CUDA: ``check(bytes_needed)`` raises
    ``torch.cuda.OutOfMemoryError`` when the request exceeds ``limit_bytes``, so the OOM handling
    of :func:`find_max_batch_size` really runs on a CPU."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes

    def check(self, bytes_needed: int) -> None:
        if bytes_needed > self.limit_bytes:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory (simulated): tried to use {format_bytes(bytes_needed)} of a "
                f"{format_bytes(self.limit_bytes)} budget"
            )


class _RandomBatches:
    """Random token batches of one shape: speed and memory do not depend on the text."""

    def __init__(self, B: int, T: int, vocab_size: int, device):
        self.B, self.T, self.V, self.device = B, T, vocab_size, torch.device(device)

    def next_batch(self):
        x = torch.randint(0, self.V, (self.B, self.T), device=self.device)
        return x, torch.roll(x, -1, dims=1)


def make_step_probe(trainer, T: int, limit: SimulatedMemoryLimit | None = None):
    """A ``try_step(B)`` for :func:`find_max_batch_size`: one full training step of ``trainer``
    (a :class:`helpers.core.train.Trainer`) on random (B, T) ids. With ``limit`` (for CPUs), the
    step first checks :func:`training_step_estimate` against the simulated budget, raising OOM
    above it.
    """
    cfg = trainer.model_config
    autocast = trainer.run.autocast is not None
    manual = trainer.run.attention == "manual"

    def try_step(B: int) -> None:
        if limit is not None:
            limit.check(training_step_estimate(cfg, B, T, autocast, manual)["total"])
        trainer.step(_RandomBatches(B, T, cfg.vocab_size, trainer.device))
        trainer.optimizer.zero_grad(set_to_none=True)  # leave no gradients behind

    return try_step
