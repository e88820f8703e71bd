import sys

import pytest
import torch

from helpers.core import train
from helpers.core.model import GPTConfig
from helpers.measure import memory


def _oom():
    return torch.cuda.OutOfMemoryError("CUDA out of memory (test)")


def test_probe_finds_the_exact_largest_batch_by_doubling_then_bisecting():
    calls = []

    def step(B):
        calls.append(B)
        if B > 37:
            raise _oom()

    res = memory.find_max_batch_size(step, "cpu", start=1)
    assert res["max_batch_size"] == 37
    assert calls[:7] == [1, 2, 4, 8, 16, 32, 64]  # doubling until the first failure
    assert len(calls) <= 7 + 5  # then a bisection between 32 and 64


def test_probe_retries_outside_the_except_block():
    def step(B):
        if sys.exc_info()[0] is not None:  # called while an exception is being handled
            raise AssertionError(
                "retried inside `except`: the failed step's tensors are still referenced"
            )
        if B > 5:
            raise _oom()

    assert memory.find_max_batch_size(step, "cpu")["max_batch_size"] == 5


def test_probe_reraises_errors_that_are_not_oom():
    def step(B):
        raise ValueError("a bug in the step")

    with pytest.raises(ValueError, match="a bug"):
        memory.find_max_batch_size(step, "cpu")


def test_probe_says_what_to_do_when_nothing_fits():
    def step(B):
        raise _oom()

    with pytest.raises(RuntimeError, match="activation checkpointing"):
        memory.find_max_batch_size(step, "cpu")


def test_margin_and_limit():
    res = memory.find_max_batch_size(lambda B: None, "cpu", limit=48, margin=0.25)
    assert res["max_batch_size"] == 48 and res["safe_batch_size"] == 36


def test_estimate_parts_for_gpt2_124m():
    est = memory.training_step_estimate(
        GPTConfig(), 16, 1024, autocast=True, manual_attention=False
    )
    n = 124_439_808
    assert est["parameters"] == est["gradients"] == 4 * n
    assert est["adamw_state"] == 8 * n
    assert est["total"] == sum(v for k, v in est.items() if k != "total")
    manual = memory.training_step_estimate(
        GPTConfig(), 16, 1024, autocast=True, manual_attention=True
    )
    assert (
        manual["activations"] - est["activations"] == 12 * 2 * 12 * 1024 * 1024 * 16 * 2
    )  # the (T, T) tensors


def test_logits_term_counts_the_fp32_cross_entropy_tensors():
    # compute-dtype logits + fp32 log-softmax output + fp32 grads of it and of its input in backward
    n_logits = 16 * 1024 * 50257
    assert memory.training_step_estimate(GPTConfig(), 16, 1024, autocast=True)[
        "logits"
    ] == n_logits * (2 + 4 + 8)
    assert memory.training_step_estimate(GPTConfig(), 16, 1024, autocast=False)[
        "logits"
    ] == n_logits * (4 + 4 + 8)


def test_simulated_limit_exercises_the_real_probe_on_cpu():
    cfg = GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=32)
    trainer = train.build(train.RunConfig(batch_size=1, seq_len=32), cfg, "cpu")
    per_b = (
        memory.training_step_estimate(cfg, 2, 32, False)["total"]
        - memory.training_step_estimate(cfg, 1, 32, False)["total"]
    )
    fixed = memory.training_step_estimate(cfg, 1, 32, False)["total"] - per_b
    limit = memory.SimulatedMemoryLimit(fixed + 11 * per_b + per_b // 2)  # room for B = 11
    res = memory.find_max_batch_size(memory.make_step_probe(trainer, 32, limit), "cpu")
    assert res["max_batch_size"] == 11
    assert any(not ok for _, ok, _ in res["tried"])
    assert trainer.model.transformer.h[0].mlp.c_fc.weight.grad is None  # nothing left behind


def test_is_oom_recognises_old_style_runtime_errors():
    assert memory.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not memory.is_oom(RuntimeError("shape mismatch"))
    assert memory.format_bytes(3 * 2**30) == "3.00 GiB" and memory.format_bytes(None) == "-"


def test_fits_reports_an_out_of_memory_step_as_none_and_raises_other_errors():
    def step(B):
        if B > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if B == 3:
            raise ValueError("a bug, not memory")

    assert memory.fits(step, 16, "cpu") == (False, None)
    assert memory.fits(step, 2, "cpu")[0] is True
    with pytest.raises(ValueError, match="a bug"):
        memory.fits(step, 3, "cpu")


def test_held_bytes_counts_what_survives_and_not_temporaries():
    a = torch.randn(256, 256)

    def fn():
        (a * 2).sum()  # a temporary of 256 KiB, freed before fn returns
        return a @ a  # 256 KiB kept

    out, held = memory.held_bytes(fn, "cpu")
    assert out.shape == (256, 256)
    assert 256 * 256 * 4 <= held < 2 * 256 * 256 * 4
