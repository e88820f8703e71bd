import math

import pytest
import torch

from helpers.core.model import (
    GPT,
    GPTConfig,
    count_parameters,
    flops_per_token,
    pad_to_multiple,
    parameter_breakdown,
)


def test_gpt2_124m_has_124_439_808_parameters():
    with torch.device("meta"):
        model = GPT(GPTConfig())
    assert count_parameters(model) == 124_439_808
    assert sum(parameter_breakdown(model).values()) == 124_439_808


def test_padded_vocab_adds_only_the_padded_rows():
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_multiple=64))
    assert model.config.padded_vocab_size == 50304
    assert count_parameters(model) == 124_439_808 + (50304 - 50257) * 768


def test_token_embedding_and_lm_head_are_tied(tiny_config):
    model = GPT(tiny_config)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=12, n_head=4, n_embd=256, block_size=64, vocab_size=1000)
    model = GPT(cfg)
    std_proj = model.transformer.h[0].attn.c_proj.weight.std().item()
    std_fc = model.transformer.h[0].mlp.c_fc.weight.std().item()
    assert std_fc == pytest.approx(0.02, rel=0.05)
    assert std_proj == pytest.approx(0.02 / math.sqrt(2 * 12), rel=0.05)
    assert model.transformer.h[0].attn.c_attn.bias.abs().max().item() == 0.0


def test_forward_shapes_and_initial_loss_near_ln_vocab(tiny_config):
    torch.manual_seed(0)
    model = GPT(tiny_config)
    idx = torch.randint(0, tiny_config.vocab_size, (3, 16))
    targets = torch.randint(0, tiny_config.vocab_size, (3, 16))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 16, tiny_config.vocab_size)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - math.log(tiny_config.vocab_size)) < 0.1
    _, no_loss = model(idx)
    assert no_loss is None


def test_sequence_longer_than_block_size_raises_clear_error(tiny_config):
    model = GPT(tiny_config)
    with pytest.raises(ValueError, match="block_size=32"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_manual_and_sdpa_attention_compute_the_same_function(tiny_config):
    torch.manual_seed(0)
    manual = GPT(tiny_config)
    sdpa = GPT(tiny_config, attention="sdpa")
    sdpa.load_state_dict(manual.state_dict())
    idx = torch.randint(0, tiny_config.vocab_size, (2, 32))
    lm, loss_m = manual(idx, idx)
    ls, loss_s = sdpa(idx, idx)
    torch.testing.assert_close(lm, ls, rtol=1e-4, atol=1e-4)
    loss_m.backward()
    loss_s.backward()
    g_m = manual.transformer.h[0].attn.c_attn.weight.grad
    g_s = sdpa.transformer.h[0].attn.c_attn.weight.grad
    torch.testing.assert_close(g_m, g_s, rtol=1e-3, atol=1e-5)


def test_attention_is_causal(tiny_config):
    torch.manual_seed(0)
    for attention in ("manual", "sdpa"):
        model = GPT(tiny_config, attention=attention)
        idx = torch.randint(0, tiny_config.vocab_size, (1, 16))
        changed = idx.clone()
        changed[0, 10:] = (changed[0, 10:] + 1) % tiny_config.vocab_size
        a, _ = model(idx)
        b, _ = model(changed)
        torch.testing.assert_close(a[:, :10], b[:, :10])  # the future does not leak into the past


def test_padding_does_not_change_the_initial_weights_of_real_rows(tiny_config):
    torch.manual_seed(1)
    plain = GPT(tiny_config)
    torch.manual_seed(1)
    padded = GPT(GPTConfig(**{**tiny_config.__dict__, "vocab_multiple": 64}))
    V = tiny_config.vocab_size
    torch.testing.assert_close(plain.transformer.wte.weight, padded.transformer.wte.weight[:V])
    assert padded.transformer.wte.weight[V:].abs().max().item() == 0.0
    torch.testing.assert_close(
        plain.transformer.h[1].mlp.c_fc.weight, padded.transformer.h[1].mlp.c_fc.weight
    )


def test_generate_never_samples_padded_ids(tiny_config):
    cfg = GPTConfig(**{**tiny_config.__dict__, "vocab_size": 100, "vocab_multiple": 64})
    torch.manual_seed(0)
    model = GPT(cfg)
    with torch.no_grad():  # make every padded id overwhelmingly likely: only masking can stop it
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)
        model.lm_head.weight[100:] = 50.0
    logits, _ = model(torch.zeros(1, 1, dtype=torch.long))
    assert logits[0, -1].argmax().item() >= 100  # unmasked, a padded id would win
    g = torch.Generator().manual_seed(0)
    out = model.generate(
        torch.zeros(4, 1, dtype=torch.long), max_new_tokens=20, top_k=None, generator=g
    )
    assert out.shape == (4, 21)
    assert out.max().item() < 100
    out_k = model.generate(
        torch.zeros(4, 1, dtype=torch.long), max_new_tokens=5, top_k=5, generator=g
    )
    assert out_k.max().item() < 100


def test_flops_per_token_matches_the_palm_formula():
    cfg = GPTConfig()
    n_without_wpe = 124_439_808 - 1024 * 768
    assert flops_per_token(cfg) == 6 * n_without_wpe + 12 * 12 * 12 * 64 * 1024
    # padding must not inflate the useful FLOPs
    assert flops_per_token(GPTConfig(vocab_multiple=64)) == flops_per_token(cfg)


@pytest.mark.parametrize(
    "n,m,expected", [(50257, 64, 50304), (50257, 128, 50304), (50304, 64, 50304), (1, 8, 8)]
)
def test_pad_to_multiple(n, m, expected):
    assert pad_to_multiple(n, m) == expected


def test_bad_attention_switch_is_rejected():
    with pytest.raises(ValueError, match="GPT.attention must be one of"):
        GPT(GPTConfig(block_size=8, n_layer=1, n_head=1, n_embd=8), attention="flash")


# ---- activation checkpointing (chapter 09) -------------------------------------------------------


def _loss_and_grads(config, idx, freeze_embeddings=False, checkpoint_every=0):
    torch.manual_seed(0)
    model = GPT(config, checkpoint_every=checkpoint_every)
    if freeze_embeddings:
        model.transformer.wte.weight.requires_grad_(False)
        model.transformer.wpe.weight.requires_grad_(False)
    _, loss = model(idx, idx)
    loss.backward()
    return model, loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("every", [1, 2, 3])
def test_activation_checkpointing_keeps_the_loss_and_gradients(tiny_config, every):
    import dataclasses

    cfg = dataclasses.replace(tiny_config, n_layer=4)
    idx = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    _, loss0, grads0 = _loss_and_grads(cfg, idx)
    _, loss1, grads1 = _loss_and_grads(cfg, idx, checkpoint_every=every)
    assert torch.allclose(loss0, loss1, rtol=0, atol=1e-6)
    assert grads0.keys() == grads1.keys()
    for name in grads0:
        assert torch.allclose(grads0[name], grads1[name], rtol=1e-5, atol=1e-7), name


@pytest.mark.parametrize("every,recomputed", [(0, []), (1, [0, 1, 2, 3]), (2, [0, 2]), (3, [0, 3])])
def test_checkpointing_recomputes_exactly_every_kth_block(tiny_config, every, recomputed):
    import dataclasses

    torch.manual_seed(0)
    model = GPT(dataclasses.replace(tiny_config, n_layer=4), checkpoint_every=every)
    calls = [0] * 4
    for i, block in enumerate(model.transformer.h):
        # a pre-hook: the recomputation stops early, once it has rebuilt what backward needs
        block.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    idx = torch.randint(0, 100, (2, 16))
    _, loss = model(idx, idx)
    assert calls == [1, 1, 1, 1]
    loss.backward()  # a checkpointed block runs its forward a second time here
    assert [i for i, c in enumerate(calls) if c == 2] == recomputed
    with torch.no_grad():
        model(idx)  # nothing to recompute without autograd: every block runs once
    assert calls == [2 + (i in recomputed) for i in range(4)]


def test_checkpointed_blocks_get_gradients_when_the_input_needs_none(tiny_config):
    idx = torch.randint(0, 100, (2, 16))
    model, _, grads = _loss_and_grads(
        tiny_config, idx, freeze_embeddings=True, checkpoint_every=1
    )
    missing = [n for n, g in grads.items() if g is None]
    assert not missing, f"no gradient for {missing}"
    assert model.transformer.wte.weight.grad is None  # frozen: really no input gradient upstream


def test_negative_checkpoint_every_is_rejected():
    with pytest.raises(ValueError, match="checkpoint_every must be >= 0"):
        GPT(GPTConfig(block_size=8, n_layer=1, n_head=1, n_embd=8), checkpoint_every=-1)


def test_the_model_picks_its_mechanisms_once_and_forward_has_no_switch_branches():
    """forward reads top to bottom: the switches are read in __init__, not in forward."""
    import inspect

    from helpers.core import model as model_module

    source = inspect.getsource(GPT.forward)
    for name in model_module.MODEL_SWITCHES:
        assert name not in source, name
    assert "import" not in source and "self.config.loss_kernel" not in source
    tiny = GPTConfig(block_size=8, vocab_size=64, n_layer=2, n_head=2, n_embd=16)
    m = GPT(tiny, attention="sdpa", checkpoint_every=2)
    assert m.switches["attention"] == "sdpa" and m.recomputed == {0}
    assert m.transformer.h[0].attn.attend == m.transformer.h[0].attn._sdpa


def test_gpt_config_holds_the_shape_only():
    import dataclasses

    from helpers.core import model as model_module

    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    assert not fields & set(model_module.MODEL_SWITCHES)
