"""Chapter 08: the fastest correct recipe for a GPU, from what it has (T4 and Colab fallbacks).

:func:`recommend_recipe` decides each switch from the device's capabilities (or a datasheet
profile of :mod:`helpers.measure.gpus`) and says why; :func:`recipe_run_config` turns the choices
into a :class:`helpers.core.train.RunConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from helpers.core.train import RunConfig
from helpers.measure.gpus import GPUProfile
from helpers.measure.hardware import capability, compile_support, default_device, emulated_profile


@dataclass(frozen=True)
class RecipeChoice:
    """One switch of the recommended configuration, with the reason for it."""

    switch: str  # a RunConfig field name
    value: object
    reason: str


def recommend_recipe(
    target: GPUProfile | torch.device | str | None = None,
    batch_size: int | None = None,
    batch_reason: str = "",
) -> list[RecipeChoice]:
    """The fastest *correct* configuration for a profile (e.g. ``PROFILES["T4"]``,
    ``PROFILES["CPU"]``) or a device (default: this one; while emulating, the emulated GPU), switch
    by switch with the reason.

    The batch size is never guessed: pass the one ``memory.find_max_batch_size`` measured as
    ``batch_size`` (with ``batch_reason`` saying how), else the choice says to measure it. Turn the
    choices into a RunConfig with :func:`recipe_run_config`.

    Rules: bf16 autocast only with native bf16 (compute capability >= 8.0; never trust
    ``torch.cuda.is_bf16_supported()``, True on a T4), else fp16 + GradScaler; TF32 only from 8.0;
    torch.compile where Triton runs (>= 7.0) or a CPU has a C++ compiler; SDPA always
    (FlashAttention-2 from 8.0, the memory-efficient kernel on 7.x); vocab padded to a multiple of
    64; fused AdamW on CUDA.
    """
    if isinstance(target, GPUProfile) and target.capability is not None:
        cap, name, compile_ok, compile_reason = (
            target.capability,
            target.name,
            target.capability >= (7, 0),
            "Triton supports >= 7.0",
        )
    else:
        device = (
            torch.device("cpu")
            if isinstance(target, GPUProfile)
            else (torch.device(target) if target is not None else default_device())
        )
        compile_ok, compile_reason = compile_support(device)
        if device.type == "cuda":
            cap = capability(device)
            name = (
                emulated_profile().name
                if emulated_profile() is not None
                else torch.cuda.get_device_name(device)
            )
        else:
            cap, name = None, "CPU"
    c = []
    if cap is None:
        c.append(
            RecipeChoice(
                "matmul_precision",
                "fp32",
                "TF32 is a tensor-core mode of NVIDIA GPUs; a CPU computes fp32",
            )
        )
        c.append(
            RecipeChoice(
                "autocast",
                None,
                (
                    "CPU runs are for correctness: keep fp32 "
                    "(bf16 autocast runs, but its speed depends on the CPU)"
                ),
            )
        )
    else:
        ampere = cap >= (8, 0)
        c.append(
            RecipeChoice(
                "matmul_precision",
                "tf32" if ampere else "fp32",
                "TF32 tensor cores (compute capability >= 8.0)"
                if ampere
                else f"sm{cap[0]}{cap[1]} has no TF32 tensor cores: the switch would do nothing",
            )
        )
        c.append(
            RecipeChoice(
                "autocast",
                "bf16" if ampere else "fp16",
                "native bf16: fp32's range, no loss scaling needed"
                if ampere
                else (
                    f"sm{cap[0]}{cap[1]} has no native bf16 (emulated, slow): "
                    "fp16 tensor cores + GradScaler "
                    "(fp16 overflows above 65504 and underflows small gradients)"
                ),
            )
        )
    c.append(
        RecipeChoice(
            "compile",
            "default" if compile_ok else None,
            f"torch.compile: {compile_reason}" if compile_ok else f"eager: {compile_reason}",
        )
    )
    kernel = (
        "FlashAttention-2 / cuDNN kernels"
        if cap is not None and cap >= (8, 0)
        else "the memory-efficient kernel (no FlashAttention-2 below sm80)"
        if cap is not None
        else "the fused CPU kernel"
    )
    c.append(
        RecipeChoice(
            "attention", "sdpa", f"SDPA never stores the (T, T) scores; here it uses {kernel}"
        )
    )
    c.append(
        RecipeChoice(
            "vocab_multiple",
            64,
            "50257 -> 50304 rows: aligned shapes for the LM head and the loss (chapter 07)",
        )
    )
    c.append(
        RecipeChoice(
            "optimizer",
            "fused" if cap is not None else "foreach",
            "fused AdamW: one kernel for all parameters"
            if cap is not None
            else "foreach AdamW: the CPU default",
        )
    )
    if batch_size is None:
        c.append(
            RecipeChoice(
                "batch_size",
                None,
                f"measure it on the {name}: memory.find_max_batch_size with a 10% margin",
            )
        )
    else:
        c.append(
            RecipeChoice(
                "batch_size",
                batch_size,
                batch_reason or f"measured on the {name} with memory.find_max_batch_size",
            )
        )
    return c


def format_recipe(choices: list[RecipeChoice]) -> str:
    """The choices as a fixed-width table: switch, value, reason."""
    lines = [f"{'switch':<18} {'value':<10} reason"]
    lines += [f"{ch.switch:<18} {ch.value!s:<10} {ch.reason}" for ch in choices]
    return "\n".join(lines)


def recipe_run_config(choices, batch_size: int, seq_len: int, name: str = "recipe") -> RunConfig:
    """A RunConfig from :func:`recommend_recipe` choices plus a measured batch size."""
    switches = {ch.switch: ch.value for ch in choices if ch.switch != "batch_size"}
    return RunConfig(name=name, batch_size=batch_size, seq_len=seq_len, **switches)
