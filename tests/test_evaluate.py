import math

import pytest
import torch

from helpers.core import data, evaluate
from helpers.core.model import GPT, GPTConfig


def _tiny(vocab_multiple: int = 1) -> GPT:
    torch.manual_seed(0)
    return GPT(
        GPTConfig(block_size=64, n_layer=1, n_head=2, n_embd=32, vocab_multiple=vocab_multiple)
    )


def test_validation_loss_of_an_untrained_model_is_about_uniform():
    model = _tiny()
    ev = evaluate.validation_loss(model, batch_size=4, seq_len=64, n_batches=3)
    assert abs(ev.loss - math.log(50257)) < 0.5  # GPT-2 init: close to a uniform guess
    assert ev.perplexity == pytest.approx(math.exp(ev.loss))
    assert (ev.batches, ev.tokens) == (3, 3 * 4 * 64)


def test_validation_loss_reads_the_val_split_in_eval_mode_without_gradients():
    model = _tiny().train()
    ev = evaluate.validation_loss(model, batch_size=2, seq_len=32, n_batches=2)
    assert model.training  # the mode is restored
    assert all(p.grad is None for p in model.parameters())
    val = data.load_tokens("val")
    first = data.BatchLoader(val, 2, 32).next_batch()
    second = data.BatchLoader(val[64:], 2, 32).next_batch()  # B*T = 64 tokens later
    with torch.no_grad():
        model.eval()
        own = [model(*first)[1].item(), model(*second)[1].item()]
    assert ev.loss == pytest.approx(sum(own) / 2, abs=1e-6)


def test_padded_and_unpadded_models_score_alike():
    """The same seed gives the same real rows; the padded columns take no part in the score."""
    plain = evaluate.validation_loss(_tiny(1), batch_size=2, seq_len=32, n_batches=2)
    padded = evaluate.validation_loss(_tiny(64), batch_size=2, seq_len=32, n_batches=2)
    assert padded.loss == pytest.approx(plain.loss, abs=1e-5)


def test_more_batches_than_the_split_holds_is_a_clear_error():
    with pytest.raises(ValueError, match="hold 1 batches .*lower n_batches"):
        evaluate.validation_loss(
            _tiny(), batch_size=2, seq_len=32, n_batches=2, tokens=torch.arange(100)
        )
    ev = evaluate.validation_loss(
        _tiny(), batch_size=2, seq_len=16, n_batches=None, tokens=torch.arange(100)
    )
    assert ev.batches == 3
