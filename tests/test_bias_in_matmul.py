"""benchmarks/bias_in_matmul.py (an experiment of results/perf-log.md): the attention with
``c_attn``'s bias inside its matmul computes the same function, with the same gradients, as
``CausalSelfAttention.forward``; a bias column in the wrong place must be caught."""

import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bias_in_matmul  # noqa: E402

from helpers.core.model import CausalSelfAttention, GPTConfig  # noqa: E402


def _grads(attn, x, autocast: bool):
    attn.zero_grad()
    x.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = attn(x)
    w = torch.linspace(-1, 1, y.numel()).view_as(y)
    (y.float() * w).sum().backward()
    return y.float(), x.grad.clone(), attn.c_attn.weight.grad.clone(), attn.c_attn.bias.grad.clone()


def _max_error(autocast: bool) -> float:
    """The largest relative difference of output, dx, dW, db: plain attention vs the
    experiment's."""
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=32)
    attn = CausalSelfAttention(cfg, attention="sdpa")
    torch.nn.init.normal_(attn.c_attn.bias, std=0.5)  # GPT-2 starts it at 0: make it count
    x = torch.randn(2, 16, 32, requires_grad=True)
    plain = _grads(attn, x, autocast)
    with bias_in_matmul.experiment():
        other = _grads(attn, x, autocast)
    return max(((a - b).norm() / b.norm()).item() for a, b in zip(other, plain))


@pytest.mark.parametrize("autocast, tol", [(False, 1e-5), (True, 5e-3)])
def test_the_bias_in_the_matmul_gives_the_same_outputs_and_gradients(autocast, tol):
    assert _max_error(autocast) < tol


def test_a_bias_column_in_the_wrong_place_is_caught():
    def shifted(x, w, b, pad=bias_in_matmul.PAD):
        x_aug, w_aug = real(x, w, b, pad)
        return x_aug, torch.roll(w_aug, 1, dims=1)  # the bias column one place off

    real = bias_in_matmul.augmented
    with mock.patch.object(bias_in_matmul, "augmented", shifted):
        assert _max_error(autocast=False) > 1e-2


def test_bad_shapes_get_a_clear_error():
    with pytest.raises(ValueError, match="augmented needs"):
        bias_in_matmul.augmented(torch.zeros(2, 4), torch.zeros(3, 5), torch.zeros(3))
    with pytest.raises(ValueError, match="pad >= 1"):
        bias_in_matmul.augmented(torch.zeros(2, 4), torch.zeros(3, 4), torch.zeros(3), pad=0)
