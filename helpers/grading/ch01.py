"""Graded checks of chapter 01 (the FP32 baseline): the loss before training and
the parameters of one block.

Every chapter module has the same shape: ``SECTIONS`` (grade id -> the section a failed check's hint
points to), the ``check_*`` functions (run the learner's function on small CPU inputs, print one
``PASS ...`` line, or raise ``AssertionError`` with a hint), ``CHECKS`` (grade id -> check) and
``WRONG_ANSWERS`` (grade id -> plausible mistakes the check must reject; tests/test_grading.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from helpers.grading.common import as_number, passed, reread

SECTIONS = {
    "ch01_loss_at_init": "chapter 01, section 4 (The loss before training)",
    "ch01_block_params": "chapter 01, section 2 (Where the parameters are)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


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
        got = as_number(fn(V), call, _reread(gid))
        want = math.log(V)
        if abs(got - want) <= 1e-4:
            continue
        if abs(got - math.log10(V)) <= 1e-4:
            why = (
                f"{call} returned {got:.4f} = log10(V): "
                "cross-entropy uses the natural log (math.log)."
            )
        elif abs(got - math.log2(V)) <= 1e-4:
            why = (
                f"{call} returned {got:.4f} = log2(V), in bits: "
                "PyTorch's cross-entropy is in nats (math.log)."
            )
        elif abs(got - 1.0 / V) <= 1e-6:
            why = (
                f"{call} returned {got:.6f} = 1/V: that is the probability of the target, "
                "not the loss -ln(p)."
            )
        elif abs(got + want) <= 1e-4:
            why = (
                f"{call} returned {got:.4f}: the loss is -ln(p), a positive number; check the sign."
            )
        else:
            why = f"{call} returned {got:.4f}, expected {want:.4f} nats."
        raise AssertionError(f"{why} {_reread(gid)}")
    passed(gid, f"expected_initial_loss(V) == ln(V) for V in {VOCAB_SIZES}")


BLOCK_WIDTHS = [(64, 4), (96, 3), (128, 8), (768, 12)]  # (n_embd, n_head), n_head divides n_embd


def measured_block_parameters(n_embd: int, n_head: int) -> int:
    """Parameters of one ``helpers.core.model.Block``, counted on the real module (sum of numel)."""
    from helpers.core.model import Block, GPTConfig  # torch is imported only when this check runs

    block = Block(GPTConfig(n_embd=n_embd, n_head=n_head, block_size=8))
    return sum(p.numel() for p in block.parameters())


def check_block_params(fn: Callable[[int], int]) -> None:
    """Check ``block_parameters(n_embd) -> int`` against a real ``helpers.core.model.Block``.

    The expected count is measured, not written down: each width builds a Block and sums
    ``p.numel()`` over its parameters (buffers such as the causal mask are not parameters).

    Raises:
        AssertionError: with a hint, when a width gives a different count.
    """
    gid = "ch01_block_params"
    for C, n_head in BLOCK_WIDTHS:
        call = f"block_parameters({C})"
        got = as_number(fn(C), call, _reread(gid))
        want = measured_block_parameters(C, n_head)
        if got == want:
            continue
        weights = 12 * C * C  # the matrices of attention (4 C^2) and MLP (8 C^2)
        missing = want - got
        if got == weights:
            why = (
                f"{call} returned {got:,.0f}: you counted the weight matrices, "
                "but no biases and no LayerNorm parameters. Every nn.Linear here has a bias; "
                "each nn.LayerNorm has a weight and a bias."
            )
        elif missing == 4 * C:
            why = (
                f"{call} returned {got:,.0f}, {missing:,.0f} short: "
                "the two LayerNorms each have a weight and a bias of size C."
            )
        elif missing == 2 * C:
            why = (
                f"{call} returned {got:,.0f}, {missing:,.0f} short: "
                "a LayerNorm has a bias as well as a weight, and a Block has two LayerNorms."
            )
        elif 0 < missing < 13 * C and missing % C == 0:
            why = (
                f"{call} returned {got:,.0f}, {missing:,.0f} = {missing // C}*C short: "
                "some biases or LayerNorm parameters are missing."
            )
        elif got in (4 * C * C, 8 * C * C) or abs(missing) >= C * C:
            why = (
                f"{call} returned {got:,.0f}, expected {want:,}: a weight matrix is off. "
                "Count c_attn (C -> 3C), attn.c_proj (C -> C), mlp.c_fc (C -> 4C) and "
                "mlp.c_proj (4C -> C)."
            )
        else:
            why = (
                f"{call} returned {got:,.0f}, expected {want:,} "
                "(measured on helpers.core.model.Block)."
            )
        raise AssertionError(f"{why} {_reread(gid)}")
    widths = [C for C, _ in BLOCK_WIDTHS]
    passed(gid, f"block_parameters(C) matches helpers.core.model.Block for C in {widths}")


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


CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = {
    "ch01_loss_at_init": check_loss_at_init,
    "ch01_block_params": check_block_params,
}

WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch01_loss_at_init": [_loss_log10, _loss_log2, _loss_probability, _loss_negative],
    "ch01_block_params": [
        _block_weights_only,
        _block_forgot_layernorm,
        _block_layernorm_without_bias,
        _block_attention_only,
        _block_mlp_hidden_c,
    ],
}
