import dataclasses
import functools

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from helpers.core import recompute, train
from helpers.core.model import GPT, GPTConfig
from helpers.measure import memory

CFG = GPTConfig(block_size=64, vocab_size=512, n_layer=4, n_head=2, n_embd=64)


def _loss_and_grads(checkpoint_every=0, policy="block", attention="sdpa"):
    torch.manual_seed(0)
    m = GPT(CFG, attention=attention, checkpoint_every=checkpoint_every, checkpoint_policy=policy)
    idx = torch.randint(0, CFG.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1))
    _, loss = m(idx, idx)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in m.named_parameters()}


@pytest.mark.parametrize(
    "setting, attention",
    [((2, "block"), "sdpa"), ((1, "selective"), "sdpa"), ((1, "selective"), "manual")],
)
def test_checkpointing_gives_the_loss_and_gradients_of_no_checkpointing(setting, attention):
    ref_loss, ref = _loss_and_grads(attention=attention)
    loss, grads = _loss_and_grads(*setting, attention=attention)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    for name, g in ref.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


def _held(checkpoint_every, policy):
    torch.manual_seed(0)
    m = GPT(CFG, attention="sdpa", checkpoint_every=checkpoint_every, checkpoint_policy=policy)
    idx = torch.randint(0, CFG.vocab_size, (4, 64), generator=torch.Generator().manual_seed(1))
    m(idx, idx)  # a first forward outside the count: one-time allocations are not the step's
    (_, loss), held = memory.held_bytes(lambda: m(idx, idx), "cpu")
    loss.backward()
    return held


def _selective_saves_memory(held):
    """The policy keeps less than no checkpointing and more than whole-block recomputation, by at
    least a fifth of what whole blocks save each way."""
    gap = held["off"] - held["block"]
    return 0.2 * gap < held["off"] - held["selective"] < 0.8 * gap


def test_selective_policy_holds_less_than_none_and_more_than_whole_blocks():
    held = {
        "off": _held(0, "block"),
        "block": _held(1, "block"),
        "selective": _held(1, "selective"),
    }
    assert held["off"] > held["block"] > 0
    assert _selective_saves_memory(held), held


def test_a_policy_that_saves_everything_fails_the_memory_check(monkeypatch):
    def save_all(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE

    held = {"off": _held(0, "block"), "block": _held(1, "block")}
    monkeypatch.setattr(
        recompute,
        "selective_context",
        functools.partial(create_selective_checkpoint_contexts, save_all),
    )
    held["selective"] = _held(1, "selective")
    assert not _selective_saves_memory(held), held


def test_the_policy_keeps_matmuls_and_attention_and_recomputes_the_rest():
    aten = torch.ops.aten
    keep = [aten.mm.default, aten.addmm.default, aten.bmm.default, aten._scaled_mm.default]
    keep.append(aten._scaled_dot_product_flash_attention_for_cpu.default)
    for op in keep:
        assert recompute.keep_matmuls_policy(None, op) == CheckpointPolicy.MUST_SAVE
    for op in (aten.gelu.default, aten.native_layer_norm.default, aten.add.Tensor):
        assert recompute.keep_matmuls_policy(None, op) == CheckpointPolicy.PREFER_RECOMPUTE


def test_checkpoint_policy_is_a_checked_switch():
    with pytest.raises(ValueError, match="checkpoint_policy"):
        GPT(CFG, checkpoint_policy="everything")
    run = train.RunConfig(checkpoint_every=1, checkpoint_policy="selective")
    assert train.model_switches(run)["checkpoint_policy"] == "selective"
    with pytest.raises(ValueError, match="checkpoint_policy"):
        dataclasses.replace(run, checkpoint_policy="x").replace()
