"""Chapter 08 (T4 and Colab fallbacks): graded checks, listed in :mod:`helpers.grading`.

Each check runs the learner's function on small CPU inputs, prints one ``PASS <grade_id>: ...``
line, or raises ``AssertionError`` whose one-line message says what is wrong and which section to
reread. ``WRONG_ANSWERS`` holds plausible mistakes each check must reject (tests/test_grading.py).
This module never imports :mod:`helpers.grading` at import time (grading imports it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from helpers.grading.common import as_number, passed, reread

SECTIONS = {
    "ch08_recipe_dtype": (
        "chapter 08, section 2 (Exercise: the precision recipe, without trusting is_bf16_supported)"
    ),
    "ch08_max_batch_15gb": "chapter 08, section 5 (Exercise: the largest batch in a T4's 15 GB)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


# ----------------------------------------------------------------------------------------------
# ch08_recipe_dtype
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeDevice:
    """A stand-in for a device, as the exercise sees it: ``name``, ``capability`` (CUDA compute
    capability ``(major, minor)``, None for a CPU) and ``is_bf16_supported()``, which answers what
    ``torch.cuda.is_bf16_supported()`` answers on that device with a recent torch (True on a T4 and
    a V100: bf16 is emulated there, slowly; False on a CPU, which has no CUDA device)."""

    name: str
    capability: tuple[int, int] | None
    torch_says_bf16: bool

    def is_bf16_supported(self) -> bool:
        return self.torch_says_bf16


RECIPE_DEVICES = [
    (
        FakeDevice("Tesla T4", (7, 5), True),
        {"autocast": "fp16", "grad_scaler": True, "tf32": False},
    ),
    (
        FakeDevice("NVIDIA A100-SXM4-40GB", (8, 0), True),
        {"autocast": "bf16", "grad_scaler": False, "tf32": True},
    ),
    (
        FakeDevice("NVIDIA H100 80GB HBM3", (9, 0), True),
        {"autocast": "bf16", "grad_scaler": False, "tf32": True},
    ),
    (
        FakeDevice("Tesla V100-SXM2-16GB", (7, 0), True),
        {"autocast": "fp16", "grad_scaler": True, "tf32": False},
    ),
    (FakeDevice("cpu", None, False), {"autocast": None, "grad_scaler": False, "tf32": False}),
]


def check_recipe_dtype(fn: Callable[[Any], Any]) -> None:
    """Check ``precision_recipe(device) -> {"autocast": "bf16" | "fp16" | None, "grad_scaler": bool,
    "tf32": bool}`` on fake T4, A100, H100, V100 and CPU devices (:class:`FakeDevice`).

    Right: bf16 autocast and TF32 from compute capability 8.0; fp16 autocast with a GradScaler and
    no TF32 below it, although ``is_bf16_supported()`` says True there; a CPU (capability None): no
    autocast, no scaler, no TF32.

    Raises:
        AssertionError: with a hint, at the first device answered wrongly.
    """
    gid = "ch08_recipe_dtype"
    for dev, want in RECIPE_DEVICES:
        got = fn(dev)
        if not isinstance(got, dict) or not set(want) <= set(got):
            raise AssertionError(
                f"precision_recipe({dev.name}) returned {got!r}: return a dict with the keys "
                f"'autocast', 'grad_scaler' and 'tf32'. {_reread(gid)}"
            )
        where = (
            "a CPU"
            if dev.capability is None
            else f"{dev.name} (sm{dev.capability[0]}{dev.capability[1]})"
        )
        if got["autocast"] != want["autocast"]:
            if want["autocast"] == "fp16" and got["autocast"] == "bf16":
                why = (
                    "is_bf16_supported() says True there, but bf16 is only emulated below compute "
                    "capability 8.0: decide from the capability"
                )
            elif want["autocast"] is None:
                why = "a CPU (capability None) keeps fp32: autocast None"
            else:
                why = "bf16 is native from compute capability 8.0 and needs no loss scaling"
            raise AssertionError(
                f"on {where} autocast should be {want['autocast']!r}, got {got['autocast']!r}: "
                f"{why}. {_reread(gid)}"
            )
        if bool(got["grad_scaler"]) != want["grad_scaler"]:
            why = (
                "fp16 gradients underflow without loss scaling: fp16 needs a GradScaler"
                if want["grad_scaler"]
                else "only fp16 needs a GradScaler (bf16 and fp32 have fp32's range)"
            )
            raise AssertionError(
                f"on {where} grad_scaler should be {want['grad_scaler']}, "
                f"got {got['grad_scaler']!r}: {why}. {_reread(gid)}"
            )
        if bool(got["tf32"]) != want["tf32"]:
            why = (
                "TF32 tensor cores exist from compute capability 8.0 only"
                if not want["tf32"]
                else "TF32 matmuls are free speed from compute capability 8.0"
            )
            raise AssertionError(
                f"on {where} tf32 should be {want['tf32']}, got {got['tf32']!r}: "
                f"{why}. {_reread(gid)}"
            )
    passed(
        gid,
        f"T4 and V100 -> fp16 + GradScaler (is_bf16_supported() said True), "
        f"A100 and H100 -> bf16 + TF32, CPU -> fp32, on {len(RECIPE_DEVICES)} devices",
    )


def _recipe_trusts_is_bf16_supported(device):
    bf16 = device.capability is not None and device.is_bf16_supported()
    if device.capability is None:
        return {"autocast": None, "grad_scaler": False, "tf32": False}
    return {
        "autocast": "bf16" if bf16 else "fp16",
        "grad_scaler": not bf16,
        "tf32": device.capability >= (8, 0),
    }


def _recipe_fp16_without_scaler(device):
    if device.capability is None:
        return {"autocast": None, "grad_scaler": False, "tf32": False}
    native = device.capability >= (8, 0)
    return {"autocast": "bf16" if native else "fp16", "grad_scaler": False, "tf32": native}


def _recipe_tf32_on_every_gpu(device):
    if device.capability is None:
        return {"autocast": None, "grad_scaler": False, "tf32": False}
    native = device.capability >= (8, 0)
    return {"autocast": "bf16" if native else "fp16", "grad_scaler": not native, "tf32": True}


# ----------------------------------------------------------------------------------------------
# ch08_max_batch_15gb
# ----------------------------------------------------------------------------------------------


def step_parts(
    config, T: int, autocast: bool, manual_attention: bool
) -> Callable[[int], dict[str, int]]:
    """``parts_for_batch(B)``: the parts of
    ``helpers.measure.memory.training_step_estimate(config, B, T, ...)`` in bytes (parameters,
    gradients, adamw_state, activations, logits; no "total"), computed from one call: the first
    three do not depend on B, the last two grow linearly with it."""
    from helpers.measure import memory

    one = memory.training_step_estimate(config, 1, T, autocast, manual_attention)
    fixed = {k: one[k] for k in ("parameters", "gradients", "adamw_state")}
    per_sample = {k: one[k] for k in ("activations", "logits")}

    def parts_for_batch(B: int) -> dict[str, int]:
        # When grading this runs in the checker on what the submission sent: numbers only (a
        # string times the bytes per sample would be gigabytes of text).
        if isinstance(B, bool) or not isinstance(B, int) or not 0 <= B <= 10**9:
            raise TypeError(f"parts_for_batch takes a batch size, an int >= 0, not {B!r:.40}")
        return {**fixed, **{k: B * v for k, v in per_sample.items()}}

    return parts_for_batch


def _reference_max_batch(parts_for_batch, budget_gb: float) -> int:
    budget = budget_gb * 10**9
    B = 0
    while sum(parts_for_batch(B + 1).values()) <= budget:
        B += 1
    return B


def _cases():
    from helpers.core.model import GPTConfig

    gpt2 = GPTConfig(vocab_multiple=64)
    return [
        ("GPT-2 124M, T=1024, fp16 autocast + SDPA", step_parts(gpt2, 1024, True, False), 15),
        ("GPT-2 124M, T=1024, fp32, manual attention", step_parts(gpt2, 1024, False, True), 15),
        (
            "GPT-2 124M, T=1024, fp16 autocast, manual attention",
            step_parts(gpt2, 1024, True, True),
            15,
        ),
        ("GPT-2 124M, T=512, fp16 autocast + SDPA", step_parts(gpt2, 512, True, False), 15),
        ("GPT-2 124M, T=1024, fp16 autocast + SDPA", step_parts(gpt2, 1024, True, False), 40),
        ("GPT-2 124M, T=1024, fp16 autocast + SDPA", step_parts(gpt2, 1024, True, False), 1),
    ]


def check_max_batch_15gb(fn: Callable[..., Any]) -> None:
    """Check ``max_batch_for_budget(parts_for_batch, budget_gb) -> int``: the largest B whose
    estimated training-step bytes, the sum of every part ``parts_for_batch(B)`` returns (see
    :func:`step_parts`), fit in ``budget_gb`` GB (1 GB = 1e9 bytes, as the T4's 15 GB); 0 when not
    even B=1 fits.

    Cases: GPT-2 124M with fp16 + SDPA, fp32 + manual attention and fp16 + manual attention at
    T=1024, fp16 + SDPA at T=512, all in 15 GB; fp16 + SDPA in 40 GB; and a 1 GB budget that fits
    nothing.

    Raises:
        AssertionError: with a hint naming the likely mistake.
    """

    gid = "ch08_max_batch_15gb"
    cases = _cases()
    got = [
        as_number(
            fn(parts, budget_gb), f"max_batch_for_budget(<{what}>, {budget_gb})", _reread(gid)
        )
        for what, parts, budget_gb in cases
    ]
    want = [_reference_max_batch(parts, budget_gb) for _, parts, budget_gb in cases]
    if got != want:
        i = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
        what, parts, budget_gb = cases[i]
        mistakes = [
            (
                _batch_forgets_optimizer_state,
                "count AdamW's two fp32 moments too (8 bytes per parameter)",
            ),
            (
                _batch_gib_budget,
                f"a budget of {budget_gb} GB is {budget_gb}e9 bytes, not {budget_gb} GiB",
            ),
            (
                _batch_first_that_does_not_fit,
                "return the last B that fits, not the first one that does not",
            ),
        ]
        why = next(
            (hint for wrong, hint in mistakes if [wrong(p, b) for _, p, b in cases] == got), None
        )
        if why is None:
            g = int(got[i])
            why = (
                f"B={g} needs {sum(parts(g).values()) / 1e9:.2f} GB"
                if got[i] > want[i]
                else (
                    f"a larger batch still fits: B={want[i]} needs "
                    f"{sum(parts(want[i]).values()) / 1e9:.2f} GB"
                )
            )
        raise AssertionError(
            f"{what} in {budget_gb} GB: expected B={want[i]}, got {got[i]:g}; {why}. {_reread(gid)}"
        )
    passed(
        gid,
        f"largest B for {len(cases) - 1} GPT-2 124M set-ups in 15 or 40 GB "
        f"(B = {want[:-1]}), and 0 when nothing fits",
    )


def _batch_forgets_optimizer_state(parts_for_batch, budget_gb):
    B = 0
    while (
        sum(v for k, v in parts_for_batch(B + 1).items() if k != "adamw_state") <= budget_gb * 10**9
    ):
        B += 1
    return B


def _batch_gib_budget(parts_for_batch, budget_gb):
    B = 0
    while sum(parts_for_batch(B + 1).values()) <= budget_gb * 2**30:
        B += 1
    return B


def _batch_first_that_does_not_fit(parts_for_batch, budget_gb):
    B = 1
    while sum(parts_for_batch(B).values()) <= budget_gb * 10**9:
        B += 1
    return B


CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = {
    "ch08_recipe_dtype": check_recipe_dtype,
    "ch08_max_batch_15gb": check_max_batch_15gb,
}

WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch08_recipe_dtype": [
        _recipe_trusts_is_bf16_supported,
        _recipe_fp16_without_scaler,
        _recipe_tf32_on_every_gpu,
    ],
    "ch08_max_batch_15gb": [
        _batch_forgets_optimizer_state,
        _batch_gib_budget,
        _batch_first_that_does_not_fit,
    ],
}
