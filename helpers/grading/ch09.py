"""Graded checks of chapter 09 (memory and throughput trade-offs),
merged into :mod:`helpers.grading`.

Each check runs the learner's function on a tiny GPT-2-shaped model on the CPU, prints one
``PASS <grade_id>: ...`` line, or raises an AssertionError whose one-line message names the mistake
and the section to reread. ``WRONG_ANSWERS`` holds the plausible mistakes each check must reject.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

from helpers.grading.common import as_number, is_close, passed, reread, run_learner

SECTIONS = {
    "ch09_accumulation_step": (
        "chapter 09, sections 1-2 (Gradient accumulation; Forgetting to divide)"
    ),
    "ch09_checkpointed_block": (
        "chapter 09, sections 4-5 (Activation checkpointing; The reentrant trap)"
    ),
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


def _tiny_gpt():
    import torch

    from helpers.core.model import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32))


def _norm(tensors) -> float:
    import torch

    return torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(t) for t in tensors])
    ).item()


# --------------------------------------------------------------------------------------------
# ch09_accumulation_step
# --------------------------------------------------------------------------------------------


def check_accumulation_step(fn: Callable[..., Any]) -> None:
    """Check ``accumulation_step(model, micro_batches) -> logged loss``.

    On a tiny GPT (fp32, CPU) with 4 and then 2 equal micro-batches: each micro-batch must get its
    own forward, the accumulated gradients must equal those of one forward + backward over the whole
    batch (relative error < 1e-4), and the returned loss must be the mean of the micro-losses (equal
    to the big batch's loss), detached from the autograd graph.

    Raises:
        AssertionError: with a one-line hint naming the mistake.
    """
    import torch

    gid = "ch09_accumulation_step"
    g = torch.Generator().manual_seed(0)
    for n, B in ((4, 8), (2, 6)):
        model = _tiny_gpt()
        ref = copy.deepcopy(model)
        x = torch.randint(0, 64, (B, 16), generator=g)
        y = torch.randint(0, 64, (B, 16), generator=g)
        micro = list(zip(x.chunk(n), y.chunk(n), strict=True))
        _, big = ref(x, y)
        big.backward()
        # the learner's step runs on a copy of the model in the submission's kernel when grading:
        # the forwards' batch sizes, the gradients and the logged loss come back, judged here
        got = run_learner(fn, _harness_accumulation, model, micro)
        seen, logged = got["forward_batches"], got["logged"]
        call = f"accumulation_step(model, {n} micro-batches of {B // n})"
        if seen != [B // n] * n:
            raise AssertionError(
                f"{call} ran forward on batches of sizes {seen}, "
                f"expected {n} forwards of {B // n}: run one forward + backward per micro-batch "
                f"(that is what keeps the memory of one micro-batch). {_reread(gid)}"
            )
        want = {k: p.grad for k, p in ref.named_parameters()}
        grads = {k: got["grads"].get(k) for k in want}
        missing = [k for k, v in grads.items() if v is None]
        if missing:
            raise AssertionError(
                f"{call} left {len(missing)} parameters without a gradient (e.g. {missing[0]}): "
                f"call backward on every micro-loss. {_reread(gid)}"
            )
        ratio = _norm(grads.values()) / _norm(want.values())
        err = max(
            (
                torch.linalg.vector_norm(grads[k] - want[k])
                / torch.linalg.vector_norm(want[k]).clamp_min(1e-30)
            ).item()
            for k in want
        )
        if not err < 1e-4:
            if abs(ratio - n) < 1e-3 * n:
                why = (
                    f"the gradients are {ratio:.2f}x those of the big batch (N = {n}): "
                    "divide each micro-loss by the number of micro-steps before backward, "
                    "not only the number you log."
                )
            elif abs(ratio - 1 / n) < 1e-3:
                why = f"the gradients are 1/{n} of the big batch's: you divided by N twice."
            else:
                why = (
                    f"the gradients differ from the big batch's by a relative {err:.1e}: "
                    "let them add up over the micro-steps (no zero_grad inside the loop) and "
                    "divide each loss by N."
                )
            raise AssertionError(f"{call}: {why} {_reread(gid)}")
        if isinstance(logged, torch.Tensor) and logged.requires_grad:
            raise AssertionError(
                f"{call} returned a loss that still holds the autograd graph (requires_grad=True): "
                f"sum loss.detach() of each micro-step, so the graphs are freed. {_reread(gid)}"
            )
        got = as_number(logged, call, _reread(gid))
        if not is_close(got, big.item(), rel=1e-5):
            if is_close(got, n * big.item(), rel=1e-5):
                why = (
                    f"returned {got:.4f} = {n} x the mean loss {big.item():.4f}: "
                    "log the mean of the micro-losses, not their sum."
                )
            elif is_close(got, big.item() / n, rel=1e-5):
                why = (
                    f"returned {got:.4f} = the mean loss / {n}: "
                    "log the mean of the undivided micro-losses."
                )
            else:
                why = (
                    f"returned {got:.4f}, expected the mean of the micro-losses, {big.item():.4f}."
                )
            raise AssertionError(f"{call} {why} {_reread(gid)}")
    # no measured error in the PASS line: its last digit differs between CPUs, and nbval compares it
    passed(
        gid,
        "gradients equal one big batch (within fp32 rounding) and the logged loss is "
        "the mean, for N = 4 and 2",
    )


def _accum_no_division(model, micro_batches):
    total = 0.0
    for x, y in micro_batches:
        _, loss = model(x, y)
        loss.backward()
        total += loss.item()
    return total


def _accum_divides_logged_loss_only(model, micro_batches):
    total = 0.0
    for x, y in micro_batches:
        _, loss = model(x, y)
        loss.backward()
        total += loss.item()
    return total / len(micro_batches)


def _accum_logs_sum(model, micro_batches):
    total = 0.0
    for x, y in micro_batches:
        _, loss = model(x, y)
        (loss / len(micro_batches)).backward()
        total += loss.item()
    return total


def _accum_keeps_graph(model, micro_batches):
    total = 0.0
    for x, y in micro_batches:
        _, loss = model(x, y)
        loss = loss / len(micro_batches)
        loss.backward()
        total = total + loss  # no detach: every micro-step's graph stays referenced
    return total


def _accum_one_big_batch(model, micro_batches):
    import torch

    x = torch.cat([x for x, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    _, loss = model(x, y)
    loss.backward()
    return loss.detach()


def _harness_accumulation(fn, model, micro_batches):
    """``fn(model, micro_batches)`` with a forward pre-hook on ``model`` that records each forward's
    batch size; the harness of ``ch09_accumulation_step``.

    Returns a dict:
        ``"forward_batches"``: the batch size of each forward of ``model``, in order (list of int);
        ``"grads"``: ``{name: p.grad}`` over ``model.named_parameters()`` (fp32 tensors of the
        parameters' shapes, or None where a parameter got no gradient);
        ``"logged"``: what ``fn`` returned, the logged loss (a float or a 0-d fp32 tensor, which
        keeps its requires_grad flag).
    """
    seen: list[int] = []
    hook = model.register_forward_pre_hook(lambda _m, args: seen.append(int(args[0].shape[0])))
    try:
        logged = fn(model, micro_batches)
    finally:
        hook.remove()
    return {
        "forward_batches": seen,
        "grads": {k: p.grad for k, p in model.named_parameters()},
        "logged": logged,
    }


# --------------------------------------------------------------------------------------------
# ch09_checkpointed_block
# --------------------------------------------------------------------------------------------


def check_checkpointed_block(fn: Callable[..., Any]) -> None:
    """Check ``checkpointed(block, x) -> y``: ``block(x)`` with activation checkpointing.

    On a real transformer Block (n_embd 32, fp32, CPU): the output, the input gradient and every
    parameter gradient must equal the plain block's (relative error < 1e-5); the block's forward
    must run again during backward (counted with a forward pre-hook), i.e. the activations were
    really dropped; and with an input that does *not* require grad every parameter must still get
    its gradient (the trap of ``use_reentrant=True``).

    Raises:
        AssertionError: with a one-line hint naming the mistake.
    """
    import torch

    from helpers.core.model import Block, GPTConfig

    gid = "ch09_checkpointed_block"
    torch.manual_seed(0)
    block = Block(GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32))
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(2, 16, 32, generator=g)
    w = torch.randn(2, 16, 32, generator=g)

    def reference(x_needs_grad: bool):
        block.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(x_needs_grad)
        y = block(x)
        (y * w).sum().backward()
        return y.detach(), x.grad, {k: p.grad.clone() for k, p in block.named_parameters()}

    def rel(a, b) -> float:
        return (
            torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30)
        ).item()

    for x_needs_grad in (True, False):
        want_y, want_xg, want_grads = reference(x_needs_grad)
        where = (
            "an input that requires grad"
            if x_needs_grad
            else "an input that does not require grad (e.g. frozen embeddings)"
        )
        # the learner's function runs forward + backward on a copy of the block in the
        # submission's kernel when grading: the output and gradients come back, judged here
        got = run_learner(fn, _harness_checkpointed, block, x0, w, x_needs_grad)
        y = got["y"]
        if got["type"] == "NoneType":
            raise AssertionError(
                f"checkpointed(block, x) returned None: return the block's output. {_reread(gid)}"
            )
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(want_y.shape):
            raise AssertionError(
                f"checkpointed(block, x) returned a {got['type']} of shape {got['shape']}, "
                f"expected the block's output {tuple(want_y.shape)}. {_reread(gid)}"
            )
        if not rel(y, want_y) <= 1e-5:  # a NaN output fails too
            raise AssertionError(
                "checkpointed(block, x) differs from block(x) "
                f"(rel. error {rel(y, want_y):.1e}): "
                f"call the block on x itself. {_reread(gid)}"
            )
        if not got["requires_grad"]:
            caught = got["warnings"]
            raise AssertionError(
                f"with {where}, the output does not require grad, "
                "so the block's parameters get no gradient (PyTorch warned: "
                f"{caught[0] if caught else 'nothing'}): "
                "this is the trap of use_reentrant=True; "
                f"pass use_reentrant=False. {_reread(gid)}"
            )
        if got["forwards"] < 2:
            raise AssertionError(
                f"the block ran its forward {got['forwards']} time(s) for forward + backward: "
                "nothing was recomputed, so its activations were stored as usual. "
                f"Wrap the call in torch.utils.checkpoint.checkpoint. {_reread(gid)}"
            )
        x_grad = got["x_grad"]
        if x_needs_grad and x_grad is None:
            raise AssertionError(
                "the input x got no gradient, so every layer below this block would stop learning: "
                f"pass x itself to checkpoint, not x.detach(). {_reread(gid)}"
            )
        grads = {k: got["grads"].get(k) for k in want_grads}
        missing = [k for k, g in grads.items() if g is None]
        if missing:
            raise AssertionError(
                f"with {where}, {len(missing)} of the block's parameters got no gradient "
                f"(e.g. {missing[0]}): use use_reentrant=False. {_reread(gid)}"
            )
        errs = [rel(grads[k], want_grads[k]) for k in want_grads]
        if x_needs_grad:
            errs.append(rel(x_grad, want_xg))
        if not all(e <= 1e-5 for e in errs):  # NaN gradients fail too
            raise AssertionError(
                f"the gradients differ from the plain block's (rel. error "
                f"{max(errs, key=lambda e: e if e == e else float('inf')):.1e}) with "
                f"{where}. {_reread(gid)}"
            )
    passed(
        gid,
        "same output and gradients as the plain block, forward recomputed in "
        "backward, every parameter gets a gradient even when the input needs none",
    )


def _harness_checkpointed(fn, block, x0, w, x_needs_grad):
    """``y = fn(block, x)`` with ``x = x0.clone().requires_grad_(x_needs_grad)``, then
    ``(y * w).sum().backward()`` where y requires grad, with a forward pre-hook on ``block`` that
    counts its forwards and the warnings caught; the harness of ``ch09_checkpointed_block``.

    Returns a dict:
        ``"type"``: the class name of what ``fn`` returned (``"NoneType"`` for None);
        ``"shape"``: its shape (tuple of int) if a tensor, else None;
        ``"y"``: the output, detached ((B, T, C) fp32, like x0), or None if not a tensor;
        ``"requires_grad"``: whether the output required grad (bool);
        ``"warnings"``: the first line of each warning raised in forward and backward (list of str);
        ``"forwards"``: how many times the block's forward ran in forward + backward (int);
        ``"x_grad"``: x's gradient ((B, T, C) fp32) or None;
        ``"grads"``: ``{name: p.grad}`` over ``block.named_parameters()`` (fp32 tensors of the
        parameters' shapes, or None where a parameter got no gradient).
    """
    import torch

    block.zero_grad(set_to_none=True)
    x = x0.clone().requires_grad_(x_needs_grad)
    calls = [0]
    hook = block.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = fn(block, x)
            is_tensor = isinstance(y, torch.Tensor)
            requires_grad = is_tensor and y.requires_grad
            if requires_grad and y.shape == w.shape:
                (y * w).sum().backward()
    finally:
        hook.remove()
    return {
        "type": type(y).__name__,
        "shape": tuple(y.shape) if is_tensor else None,
        "y": y.detach() if is_tensor else None,
        "requires_grad": bool(requires_grad),
        "warnings": [str(c.message).splitlines()[0] for c in caught if str(c.message)],
        "forwards": calls[0],
        "x_grad": x.grad,
        "grads": {k: p.grad for k, p in block.named_parameters()},
    }


def _ckpt_reentrant(block, x):
    import torch.utils.checkpoint

    return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)


def _ckpt_plain(block, x):
    return block(x)


def _ckpt_nan(block, x):
    import torch.utils.checkpoint

    block(x)  # a second forward, as if recomputed
    return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) * float("nan")


def _ckpt_detached_input(block, x):
    import torch.utils.checkpoint

    return torch.utils.checkpoint.checkpoint(block, x.detach(), use_reentrant=False)


CHECKS = {
    "ch09_accumulation_step": check_accumulation_step,
    "ch09_checkpointed_block": check_checkpointed_block,
}

WRONG_ANSWERS = {
    "ch09_accumulation_step": [
        _accum_no_division,
        _accum_divides_logged_loss_only,
        _accum_logs_sum,
        _accum_keeps_graph,
        _accum_one_big_batch,
    ],
    "ch09_checkpointed_block": [_ckpt_reentrant, _ckpt_plain, _ckpt_detached_input, _ckpt_nan],
}
