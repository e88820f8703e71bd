"""Tests for helpers/core/generation.py: the KV cache gives GPT.generate's tokens, faster."""

from __future__ import annotations

import pytest
import torch

from helpers import grading
from helpers.core import generation
from helpers.core.model import GPT, GPTConfig


def tiny_model(attention: str = "manual", vocab_multiple: int = 1) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        block_size=32, vocab_size=100, vocab_multiple=vocab_multiple, n_layer=2, n_head=2, n_embd=32
    )
    return GPT(cfg, attention=attention)


def prompt(batch: int = 3, length: int = 5) -> torch.Tensor:
    return torch.randint(0, 100, (batch, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("vocab_multiple", [1, 64])
@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_generate_cached_gives_generate_tokens_greedy_and_sampled(attention, vocab_multiple):
    model = tiny_model(attention, vocab_multiple)
    idx = prompt()
    greedy = model.generate(idx, 20, top_k=1)
    assert torch.equal(generation.generate_cached(model, idx, 20, top_k=1), greedy)
    for top_k, temperature in ((None, 1.0), (10, 0.7)):
        kw = dict(temperature=temperature, top_k=top_k)
        want = model.generate(idx, 20, generator=torch.Generator().manual_seed(2), **kw)
        got = generation.generate_cached(
            model, idx, 20, generator=torch.Generator().manual_seed(2), **kw
        )
        assert torch.equal(got, want), (top_k, temperature)
        assert got.shape == (3, 25) and torch.equal(got[:, :5], idx)
    assert not torch.equal(want, greedy)  # the sampled run really sampled


def test_gpt_generate_with_use_cache_gives_the_recomputed_tokens():
    model = tiny_model("sdpa", vocab_multiple=64)
    idx = prompt()
    assert torch.equal(
        model.generate(idx, 20, top_k=1, use_cache=True), model.generate(idx, 20, top_k=1)
    )
    sampled = [
        model.generate(idx, 20, generator=torch.Generator().manual_seed(3), use_cache=c)
        for c in (False, True)
    ]
    assert torch.equal(*sampled)
    with pytest.raises(ValueError, match="does not crop"):
        model.generate(prompt(1, 12), 21, use_cache=True)


def test_generate_cached_never_samples_padded_ids():
    model = tiny_model("sdpa", vocab_multiple=64)  # 100 real ids, 128 rows
    with torch.no_grad():  # make the padded ids by far the most likely: only masking keeps them out
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)
        model.lm_head.weight[100:] = 1.0
    out = generation.generate_cached(
        model, prompt(), 20, top_k=None, generator=torch.Generator().manual_seed(0)
    )
    assert out.max().item() < 100


def test_decode_step_logits_equal_full_recomputation_at_every_position():
    model = tiny_model("manual").eval()
    idx = prompt(2, 12)
    cache = generation.KVCache.for_model(model, 2, 12)
    with torch.no_grad():
        full, _ = model(idx)  # (B, T, V)
        logits = [generation.prefill(model, idx[:, :4], cache)]
        for t in range(4, 12):
            logits.append(generation.decode_step(model, idx[:, t : t + 1], cache, torch.tensor(t)))
    for t, row in zip(range(3, 12), logits, strict=True):
        torch.testing.assert_close(row, full[:, t], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_is_causal_with_one_query_is_wrong_and_the_mask_is_right(attention):
    diffs = generation.pitfall_is_causal_with_cache(tiny_model(attention), prompt(2, 10))
    assert diffs["wrong_max_abs_diff"] > 1e-2  # logits at init are ~0.1: this is all of them
    assert diffs["right_max_abs_diff"] < 1e-5


def test_cache_bytes_is_the_formula_and_the_allocated_tensors():
    # GPT-2 124M, B=1, T=1024, fp32: 2 * 12 * 1 * 1024 * 768 * 4
    assert generation.cache_bytes(GPTConfig(), 1, 1024, torch.float32) == 75_497_472
    cfg = GPTConfig(block_size=32, vocab_size=100, n_layer=3, n_head=2, n_embd=16)
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        cache = generation.KVCache(cfg, batch=5, t_max=7, dtype=dtype)
        assert cache.k.shape == (3, 5, 2, 7, 8) and cache.k.dtype == dtype
        assert cache.nbytes == generation.cache_bytes(cfg, 5, 7, dtype) == 2 * 3 * 5 * 7 * 16 * size


def test_the_cache_takes_the_models_dtype():
    model = tiny_model().to(torch.bfloat16)
    assert generation.KVCache.for_model(model, 1, 8).k.dtype == torch.bfloat16


def test_a_request_longer_than_block_size_is_refused_not_cropped():
    model = tiny_model()
    generation.generate_cached(model, prompt(1, 12), 20)  # 12 + 20 = 32 = block_size: fits
    with pytest.raises(ValueError, match="block_size 32.*at most 20 new tokens"):
        generation.generate_cached(model, prompt(1, 12), 21)
    with pytest.raises(ValueError, match="temperature"):
        generation.generate_cached(model, prompt(1, 4), 2, temperature=0)


@pytest.mark.parametrize("mode", generation.MODES)
@pytest.mark.parametrize("method", ["recompute", "cache"])
def test_generation_speed_returns_positive_numbers_on_cpu(method, mode):
    row = generation.generation_speed(tiny_model(), 2, 4, 6, method, "cpu", mode, iters=2)
    assert row["status"] == "measured" and row["peak_mem_bytes"] is None
    assert row["ms_per_token"] > 0 and row["tokens_per_s"] > 0
    assert row["tokens_per_s"] == pytest.approx(2 * 1e3 / row["ms_per_token"])


def test_generation_speed_refuses_unknown_method_and_mode():
    with pytest.raises(ValueError, match="method"):
        generation.generation_speed(tiny_model(), 1, 2, 2, "beam")
    with pytest.raises(ValueError, match="mode"):
        generation.generation_speed(tiny_model(), 1, 2, 2, "cache", mode="grad")


# ---- the graded exercise: kv_attention ---------------------------------------------------------


def test_the_helpers_kv_attention_passes_the_check(capsys):
    grading.check_kv_attention(generation.kv_attention)
    assert capsys.readouterr().out.startswith("PASS ch13_kv_attention:")


@pytest.mark.parametrize(
    "wrong,words",
    [
        (grading.ch13._kv_is_causal, "is_causal=True with one query"),
        (grading.ch13._kv_whole_cache, "slots >= pos"),
        (grading.ch13._kv_off_by_one, "pos - 1 positions"),
        (grading.ch13._kv_no_scale, "not scaled"),
    ],
)
def test_the_kv_attention_check_names_each_mistake(wrong, words):
    with pytest.raises(AssertionError, match=words) as info:
        grading.check_kv_attention(wrong)
    assert "Reread chapter 13" in str(info.value)


def test_the_compiled_method_is_skipped_with_the_reason_when_compile_cannot_run(monkeypatch):
    from helpers.measure import hardware

    monkeypatch.setattr(hardware, "compile_support", lambda device: (False, "no C++ compiler"))
    row = generation.generation_speed(tiny_model(), 1, 2, 2, "cache_compiled")
    assert row["status"] == "skipped" and row["reason"] == "no C++ compiler"
    assert row["ms_per_token"] is None and row["tokens_per_s"] is None
