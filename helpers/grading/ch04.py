"""Graded checks of chapter 04 (mixed precision): a correct mixed-precision training step
(autocast, GradScaler, clipping) and the autocast dtype per GPU.

Every chapter module has the same shape: ``SECTIONS`` (grade id -> the section a failed check's hint
points to), the ``check_*`` functions (run the learner's function on small CPU inputs, print one
``PASS ...`` line, or raise ``AssertionError`` with a hint), ``CHECKS`` (grade id -> check) and
``WRONG_ANSWERS`` (grade id -> plausible mistakes the check must reject; tests/test_grading.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from helpers.grading.common import as_number, is_close, passed, reread, run_learner
from helpers.grading.wire import data_or_type_name

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


def _reference_step(model, optimizer, scaler, x, y, dtype) -> float:
    """The step the learner's is compared with: PyTorch's AMP recipe with clipping
    (https://pytorch.org/docs/stable/notes/amp_examples.html#gradient-clipping)."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        _, loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def _grads_at_step(optimizer) -> list:
    """The gradients, flattened into one fp32 vector, each time ``optimizer.step`` runs (appended
    by a pre-step hook): what the update really used, after any unscaling and clipping."""
    import torch

    seen = []

    def record(opt, args, kwargs):
        params = [p for group in opt.param_groups for p in group["params"]]
        grads = [p.grad.detach().float().flatten() for p in params if p.grad is not None]
        seen.append(torch.cat(grads) if grads else torch.zeros(1))

    optimizer.register_step_pre_hook(record)
    return seen


def _logits_dtypes(model) -> list:
    """The dtype of every output of ``model.lm_head`` (appended by a forward hook)."""
    dtypes = []
    model.lm_head.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    return dtypes


def _inf_on_backward(param, which: int) -> None:
    """Make the ``which``-th backward pass (1-based) through ``param`` give it an inf gradient, as
    an fp16 overflow would."""
    import torch

    calls = [0]

    def hook(grad):
        calls[0] += 1
        return torch.full_like(grad, float("inf")) if calls[0] == which else grad

    param.register_hook(hook)


def _flat(model):
    import torch

    return torch.cat([p.detach().float().flatten() for p in model.parameters()])


STEPS, INF_STEP = 3, 2  # fp16: step 2's gradients hold an inf, so it must be skipped


def _training(model, dtype):
    """SGD (lr 0.1), a GradScaler and the gradients each optimizer step uses
    (:func:`_grads_at_step`) for ``model``, the learner's or the reference. fp16: a scaler
    starting at 2^16 that grows after every clean step (growth_interval=1, so a missing update()
    shows at once), and an inf planted in the gradients of step :data:`INF_STEP`; bf16: a
    disabled scaler (scale(), unscale_(), step() and update() then do nothing but the optimizer
    step)."""
    import torch

    fp16 = dtype is torch.float16
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=1, enabled=fp16)
    if fp16:
        _inf_on_backward(model.transformer.h[0].mlp.c_fc.weight, INF_STEP)
    return opt, scaler, _grads_at_step(opt)


def _harness_autocast_steps(
    autocast_step: Callable[..., Any], model, x, y, dtype, steps: int
) -> list[dict[str, Any]]:
    """Run ``autocast_step(model, optimizer, scaler, x, y, dtype)`` ``steps`` times where the
    learner's function lives, on ``model`` (the checker's tiny GPT, given stale gradients of 1e3
    here: the step must clear them) with :func:`_training`'s optimizer and GradScaler (wrapped in
    a :class:`_SpyScaler`) and a forward hook on ``model.lm_head``. Stops after a step that raised
    an AssertionError, RuntimeError or ValueError (a NotImplementedError propagates).

    Returns:
        one dict per step run: ``"raised"``, None or ``[class name, first line of the message]``;
        ``"calls"``, the list of GradScaler method names called (str); ``"loss"``, what the step
        returned (a number, a CPU tensor), or ``"<a TYPE>"`` when that is not data; ``"dtypes"``,
        the sorted str dtypes of the parameters after the step; ``"scale"``, the float
        ``scaler.get_scale()``; ``"weights"``, the parameters after the step, flattened into one
        float32 tensor of shape (n_params,); ``"stepped"``, the int number of
        ``optimizer.step`` calls in the step; ``"grad"``, None if it did not step, else the
        gradients that the last of those used, a float32 tensor of shape (n_params,);
        ``"logits"``, the torch.dtype of each ``lm_head`` output in the step. A step that raised
        has only ``"raised"`` and ``"calls"``.
    """
    import torch

    for p in model.parameters():  # stale gradients of an earlier step: the step must clear them
        p.grad = torch.full_like(p, 1e3)
    opt, scaler, seen = _training(model, dtype)
    logits = _logits_dtypes(model)
    spy, reports = _SpyScaler(scaler), []
    for _ in range(steps):
        spy.calls.clear()
        stepped, logged = len(seen), len(logits)
        try:
            loss = autocast_step(model, opt, spy, x, y, dtype)
        except NotImplementedError:
            raise
        except (AssertionError, RuntimeError, ValueError) as e:  # raised by the GradScaler
            first = (str(e).strip().splitlines() or [""])[0]
            reports.append({"raised": [type(e).__name__, first], "calls": list(spy.calls)})
            break
        reports.append(
            {
                "raised": None,
                "calls": list(spy.calls),
                "loss": data_or_type_name(loss),
                "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
                "scale": float(scaler.get_scale()),
                "weights": _flat(model),
                "stepped": len(seen) - stepped,
                "grad": seen[-1] if len(seen) > stepped else None,
                "logits": logits[logged:],
            }
        )
    return reports


def _report(reports: Any, step: int, ref_w) -> dict[str, Any]:
    """The learner's side's report of ``step`` (1-based), checked for the fields the check reads;
    AssertionError if it is missing or malformed."""
    import torch

    report = reports[step - 1] if isinstance(reports, list) and len(reports) >= step else None
    ok = isinstance(report, dict) and isinstance(report.get("calls"), list)
    raised = report.get("raised") if ok else None
    if raised is not None:
        ok = isinstance(raised, list) and len(raised) == 2
        ok = ok and all(isinstance(r, str) for r in raised)
    elif ok:
        w, grad = report.get("weights"), report.get("grad")
        ok = (
            isinstance(w, torch.Tensor)
            and w.shape == ref_w.shape
            and (grad is None or isinstance(grad, torch.Tensor) and grad.shape == ref_w.shape)
            and isinstance(report.get("dtypes"), list)
            and isinstance(report.get("logits"), list)
            and isinstance(report.get("scale"), (int, float))
            and isinstance(report.get("stepped"), int)
        )
    if not ok:
        raise AssertionError(
            f"the learner's side sent no well-formed report of step {step} "
            f"(the course's harness was changed?). {_reread('ch04_autocast_step')}"
        )
    return report


def _why_scale_differs(calls: list[str]) -> str:
    if not {"scale", "unscale_", "step", "update"} & set(calls):
        return "the GradScaler was not used: with fp16 every step goes through it"
    if "update" not in calls:
        return (
            "scaler.update() was not called: it grows the scale after clean steps and halves it "
            "after a skipped one"
        )
    return "call scale(), unscale_(), step() and update() once each, in that order"


def _why_weights_differ(seen, want, calls: list[str], logits: list, dtype) -> str:
    """The likely mistake, from the gradients the learner's optimizer step used (``seen``, None if
    it did not step) against the reference's (``want``), the scaler methods called and the
    logits' dtypes."""
    import torch

    if seen is None:
        return "the optimizer did not step: call scaler.step(optimizer)"
    norm, ref_norm = float(seen.norm()), float(want.norm())
    if norm < 1e-2 * ref_norm and "scale" not in calls:
        return (
            f"the optimizer saw a gradient norm of {norm:.2e} instead of {ref_norm:.2e}: backward "
            "ran on the unscaled loss, and unscale_ divided it by the scale all the same. Call "
            "scaler.scale(loss).backward()"
        )
    if norm < 1e-2 * ref_norm:
        return (
            f"the optimizer saw a gradient norm of {norm:.2e} instead of {ref_norm:.2e}: "
            "clip_grad_norm_ clipped the *scaled* gradients. Call scaler.unscale_(optimizer) "
            "before torch.nn.utils.clip_grad_norm_"
        )
    if norm > 1.0 + 1e-3:
        return (
            f"the optimizer saw a gradient norm of {norm:.3g}: clip it to 1.0 with "
            "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0) after "
            "scaler.unscale_(optimizer)"
        )
    if float(torch.nn.functional.cosine_similarity(seen, want, dim=0)) < 0.99:
        return (
            "the gradients point elsewhere: stale gradients of an earlier step were added to "
            "this step's. Call optimizer.zero_grad(set_to_none=True) first"
        )
    if logits and logits[-1] != dtype:
        return (
            f"the logits came out in {logits[-1]}: run the forward pass and the loss under "
            "torch.autocast(device_type=x.device.type, dtype=dtype)"
        )
    return (
        "zero the gradients, run the forward pass and the loss under torch.autocast, then "
        "scale(loss).backward(), unscale_, clip_grad_norm_(model.parameters(), 1.0), step, update"
    )


def check_autocast_step(fn: Callable[..., Any]) -> None:
    """Check ``autocast_step(model, optimizer, scaler, x, y, dtype) -> float`` on a tiny GPT on the
    CPU against a reference step (:func:`_reference_step`) from the same weights and batch:
    :data:`STEPS` steps with bf16 and a disabled GradScaler, then as many with fp16 and a real one
    (see :func:`_training`: a scale that grows after every clean step, and inf gradients in step
    :data:`INF_STEP`, which must be skipped). After every step the parameters must still be fp32,
    and the returned loss, the scale and the weights must match the reference's (weights within
    1e-4 of the update's size; SGD, so a wrong gradient shows in them, where AdamW would normalise
    it away). The hint names the mistake from the GradScaler methods called, the gradients the
    optimizer step used and the logits' dtype.

    The learner's steps run where the learner's function lives (:func:`_harness_autocast_steps`,
    on a copy of the seeded model built here); the reference run, and every comparison, run here.
    The loss, scale and weights the harness reports are checked against that reference; the
    parameters' dtypes, the number of optimizer steps, and the GradScaler calls, gradients and
    logits' dtypes the hints are chosen from are, when grading, the submission's own report.

    Raises:
        AssertionError: with a hint.
    """
    import torch

    gid = "ch04_autocast_step"
    call = "autocast_step(model, optimizer, scaler, x, y, dtype)"
    for dtype in (torch.bfloat16, torch.float16):
        name, fp16 = str(dtype).replace("torch.", ""), dtype is torch.float16
        model, x, y = _tiny_gpt()
        ref_model = copy.deepcopy(model)
        ref_opt, ref_scaler, want = _training(ref_model, dtype)
        w0 = _flat(ref_model)
        reports = run_learner(fn, _harness_autocast_steps, model, x, y, dtype, STEPS)
        logits: list = []
        for step in range(1, STEPS + 1):
            at = f"{name} step {step}{' (inf gradients)' if fp16 and step == INF_STEP else ''}"
            report = _report(reports, step, w0)
            calls = report["calls"]
            if report["raised"] is not None:
                kind, first = report["raised"]
                why = (
                    "backward ran on the unscaled loss: call scaler.scale(loss).backward()"
                    if "scale" not in calls
                    else "call scale(loss).backward(), unscale_(optimizer), clip, step(optimizer) "
                    "and update() once each, in that order"
                )
                raise AssertionError(
                    f"{at}: autocast_step raised {kind} ({first}): {why}. {_reread(gid)}"
                )
            ref_stepped = len(want)
            ref_loss = _reference_step(ref_model, ref_opt, ref_scaler, x, y, dtype)
            logits += report["logits"]
            low = sorted(str(d) for d in report["dtypes"] if d != str(torch.float32))
            if low:
                raise AssertionError(
                    f"parameters are now {low}: keep the master weights in fp32 "
                    f"(autocast casts per operation; never call model.to({name})). {_reread(gid)}"
                )
            value = as_number(report["loss"], call, _reread(gid))
            if not is_close(value, ref_loss, rel=1e-3):
                raise AssertionError(
                    f"{at}: returned {value:.6g}, expected the loss {ref_loss:.6g}: return "
                    f"loss.item(), the unscaled loss. {_reread(gid)}"
                )
            if report["scale"] != ref_scaler.get_scale():
                raise AssertionError(
                    f"{at}: the scale is {report['scale']:g}, expected "
                    f"{ref_scaler.get_scale():g}: {_why_scale_differs(calls)}. {_reread(gid)}"
                )
            w, ref_w = report["weights"].float(), _flat(ref_model)
            if not torch.isfinite(w).all() or (len(want) == ref_stepped and report["stepped"]):
                raise AssertionError(
                    f"{at}: the optimizer stepped on gradients holding inf"
                    f"{' (the weights are now inf/nan)' if not torch.isfinite(w).all() else ''}: "
                    "call scaler.step(optimizer), not optimizer.step(); it skips the step when "
                    f"unscale_ found inf/nan. {_reread(gid)}"
                )
            err = float((w - ref_w).norm() / (ref_w - w0).norm())
            if not err <= 1e-4:  # a NaN error fails too
                why = _why_weights_differ(report["grad"], want[-1], calls, logits, dtype)
                raise AssertionError(
                    f"{at}: the weights differ from a correct step's (relative error {err:.1e}): "
                    f"{why}. {_reread(gid)}"
                )
    passed(
        gid,
        f"{STEPS} bf16 and {STEPS} fp16 steps give the reference loss, scale and "
        "weights: gradients unscaled before clipping, the inf step skipped",
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
    passed(gid, f"fp16 below sm80, bf16 from sm80, CPU -> {cpu}")


def _step_weights_to_low_precision(model, optimizer, scaler, x, y, dtype):
    import torch

    model.to(dtype)
    optimizer.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def _step_without_autocast(model, optimizer, scaler, x, y, dtype):
    import torch

    optimizer.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def _step_without_zero_grad(model, optimizer, scaler, x, y, dtype):
    import torch

    with torch.autocast(device_type=x.device.type, dtype=dtype):
        _, loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def _step_ignores_the_scaler(model, optimizer, scaler, x, y, dtype):
    import torch

    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def _step_without_clipping(model, optimizer, scaler, x, y, dtype):
    import torch

    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        _, loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def _step_clip_before_unscale(model, optimizer, scaler, x, y, dtype):
    import torch

    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        _, loss = model(x, y)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # clips S times the gradients
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def _step_without_update(model, optimizer, scaler, x, y, dtype):
    import torch

    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        _, loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    return loss.item()


def _step_optimizer_step_directly(model, optimizer, scaler, x, y, dtype):
    import torch

    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        _, loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()  # steps even when unscale_ found inf/nan
    scaler.update()
    return loss.item()


def _step_backward_on_unscaled_loss(model, optimizer, scaler, x, y, dtype):
    import torch

    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        _, loss = model(x, y)
    loss.backward()  # unscale_ below still divides by the scale
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


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
        _step_without_zero_grad,
        _step_ignores_the_scaler,
        _step_without_clipping,
        _step_clip_before_unscale,
        _step_without_update,
        _step_optimizer_step_directly,
        _step_backward_on_unscaled_loss,
    ],
    "ch04_autocast_dtype": [
        _dtype_always_bf16,
        _dtype_trusts_is_bf16_supported,
        _dtype_known_generations_only,
    ],
}
