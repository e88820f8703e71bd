"""Graded checks of chapter 04 (mixed precision): a correct autocast training step and
the autocast dtype per GPU.

Every chapter module has the same shape: ``SECTIONS`` (grade id -> the section a failed check's hint
points to), the ``check_*`` functions (run the learner's function on small CPU inputs, print one
``PASS ...`` line, or raise ``AssertionError`` with a hint), ``CHECKS`` (grade id -> check) and
``WRONG_ANSWERS`` (grade id -> plausible mistakes the check must reject; tests/test_grading.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from helpers.grading.common import reread

SECTIONS = {
    "ch04_autocast_step": "chapter 04, section 6 (Exercise: a correct autocast training step)",
    "ch04_autocast_dtype": "chapter 04, section 2 (Exercise: which autocast dtype for which GPU)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


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

    from helpers.core.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=128, n_layer=1, n_head=2, n_embd=32))
    x = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(2))
    return model, x, y


def check_autocast_step(fn: Callable[..., Any]) -> None:
    """Check ``autocast_step(model, optimizer, x, y, dtype, scaler=None) -> (logits, loss)`` on a
    tiny GPT on the CPU: logits in the autocast dtype, master weights still fp32, loss within 2% of
    the fp32 loss, the weights updated; with fp16 the GradScaler's scale/step/update are used.

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
        for p in (
            model.parameters()
        ):  # stale gradients of an earlier step: the step must clear them first
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
                f"with dtype={name} the logits came out in {logits.dtype}: run the forward pass "
                f"inside torch.autocast(device_type=x.device.type, dtype=dtype). {_reread(gid)}"
            )
        wrong = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
        if wrong:
            raise AssertionError(
                f"parameters are now {wrong}: keep the master weights in fp32 "
                f"(autocast casts per operation; never call model.to({name})). {_reread(gid)}"
            )
        loss_value, ref_value = float(torch.as_tensor(loss).detach()), float(ref_loss)
        rel = abs(loss_value - ref_value) / ref_value
        if rel > 0.02:
            raise AssertionError(
                f"loss {loss_value:.4f} vs fp32 {ref_value:.4f} ({100 * rel:.1f}% apart). "
                f"{_reread(gid)}"
            )
        if torch.equal(before, model.transformer.h[0].mlp.c_fc.weight.detach()):
            raise AssertionError(
                f"the weights did not change: call the optimizer step. {_reread(gid)}"
            )
        grad = model.transformer.h[0].mlp.c_fc.weight.grad
        if (
            grad is not None
            and grad.abs().max() > 0
            and (grad.float() - ref_grad).abs().max() > 1e-2 * ref_grad.abs().max() + 1.0
        ):
            raise AssertionError(
                "the gradients after the step hold more than this step's "
                "gradient (stale gradients of an earlier step were added to it): "
                f"call optimizer.zero_grad(set_to_none=True) before backward. {_reread(gid)}"
            )
        if scaler is not None:
            missing = [m for m in ("scale", "step", "update") if m not in scaler.calls]
            if missing:
                raise AssertionError(
                    f"with fp16 the GradScaler's {missing} were not called: "
                    "backward on scaler.scale(loss), then scaler.step(optimizer) and "
                    f"scaler.update(). {_reread(gid)}"
                )
    print(
        f"PASS {gid}: bf16 and fp16 (+ GradScaler) steps: logits in the autocast dtype, "
        "fp32 master weights, loss within 2% of fp32"
    )


# Volta, Turing, Ampere (A100, A10/RTX 30), Ada, Hopper, Blackwell (B200, RTX 50)
CAPABILITY_CASES = [
    ((7, 0), "float16"),
    ((7, 5), "float16"),
    ((8, 0), "bfloat16"),
    ((8, 6), "bfloat16"),
    ((8, 9), "bfloat16"),
    ((9, 0), "bfloat16"),
    ((10, 0), "bfloat16"),
    ((12, 0), "bfloat16"),
]


def check_autocast_dtype(fn: Callable[..., Any]) -> None:
    """Check ``pick_autocast_dtype(capability) -> torch.dtype | None``: fp16 below compute
    capability 8.0 (no native bf16), bf16 from 8.0; for a CPU (``None``) bf16 or None are both
    accepted.

    Raises:
        AssertionError: with a hint.
    """
    import torch

    gid = "ch04_autocast_dtype"
    for cap, want in CAPABILITY_CASES:
        got = fn(cap)
        if got is not getattr(torch, want):
            why = (
                "bf16 needs compute capability >= 8.0; below it, use fp16 with a GradScaler"
                if want == "float16"
                else "from compute capability 8.0 bf16 is native and needs no loss scaling"
            )
            raise AssertionError(
                f"pick_autocast_dtype({cap}) returned {got}, expected torch.{want}: "
                f"{why}. {_reread(gid)}"
            )
    cpu = fn(None)
    if cpu not in (None, torch.bfloat16):
        raise AssertionError(
            f"pick_autocast_dtype(None) (a CPU) returned {cpu}: "
            f"use torch.bfloat16 or None (fp32). {_reread(gid)}"
        )
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
    "ch04_autocast_step": check_autocast_step,
    "ch04_autocast_dtype": check_autocast_dtype,
}

WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch04_autocast_step": [
        _step_weights_to_low_precision,
        _step_without_autocast,
        _step_fp16_without_scaler,
        _step_without_zero_grad,
    ],
    "ch04_autocast_dtype": [
        _dtype_always_bf16,
        _dtype_trusts_is_bf16_supported,
        _dtype_known_generations_only,
    ],
}
