"""Validation loss and perplexity: how well a model predicts text it was not trained on.

The loss is the mean cross-entropy of the next token in nats, over the tokenizer's real vocabulary
(padded logits are left out, so a padded and an unpadded model are scored alike); perplexity is
exp(loss), the number of equally likely tokens the model is as unsure as. A uniform guess over
GPT-2's 50257 ids scores ln(50257) = 10.82 nats, perplexity 50257.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from helpers.core import data
from helpers.core.model import GPT


@dataclass(frozen=True)
class Evaluation:
    """One evaluation: ``loss`` (nats per token), ``perplexity`` (exp(loss)), over ``batches``
    batches of ``tokens`` predicted tokens."""

    loss: float
    perplexity: float
    batches: int
    tokens: int


@torch.no_grad()
def validation_loss(
    model: GPT,
    batch_size: int = 8,
    seq_len: int | None = None,
    n_batches: int | None = 10,
    tokens: torch.Tensor | None = None,
) -> Evaluation:
    """Mean next-token loss (nats) and perplexity of ``model`` over ``n_batches`` consecutive
    (``batch_size``, ``seq_len``) batches of the validation split
    (``data.load_tokens("val")``, the last 10% of Tiny Shakespeare) or of ``tokens``.

    Runs in eval() mode under no_grad (the model's mode is restored), on the model's device, in the
    precision the caller sets (fp32 unless you wrap it in autocast). The loss is computed here from
    the logits over the first ``vocab_size`` columns, whatever loss kernel the model was built with.
    ``seq_len`` defaults to the model's block_size; ``n_batches=None`` uses every full batch.

    Raises:
        ValueError: the split cannot fill ``n_batches`` batches without repeating tokens (the
            message says how many fit), or seq_len > block_size.
    """
    cfg = model.config
    T = cfg.block_size if seq_len is None else seq_len
    if T > cfg.block_size:
        raise ValueError(f"seq_len={T} > the model's block_size={cfg.block_size}")
    tokens = data.load_tokens("val") if tokens is None else tokens
    fit = (tokens.numel() - 1) // (batch_size * T)
    if fit < 1 or (n_batches is not None and n_batches > fit):
        raise ValueError(
            f"{tokens.numel():,} tokens hold {fit} batches of B={batch_size}, T={T} "
            f"(asked for {n_batches}): lower n_batches, B or T"
        )
    n = fit if n_batches is None else n_batches
    device = next(model.parameters()).device
    loader = data.BatchLoader(tokens, batch_size, T, device)
    was_training = model.training
    model.eval()
    total = 0.0
    try:
        for _ in range(n):
            x, y = loader.next_batch()  # (B, T) each
            logits, _ = model(x)  # (B, T, V_padded)
            real = logits[..., : cfg.vocab_size].float()  # (B, T, V)
            total += F.cross_entropy(real.reshape(-1, cfg.vocab_size), y.reshape(-1)).item()
    finally:
        model.train(was_training)
    loss = total / n  # every batch has B*T tokens: the mean of the means is the token mean
    return Evaluation(loss=loss, perplexity=math.exp(loss), batches=n, tokens=n * batch_size * T)
