"""Graded checks of chapter 07 (vocab padding): padding the vocabulary and
never sampling a padded id.

Every chapter module has the same shape: ``SECTIONS`` (grade id -> the section a failed check's hint
points to), the ``check_*`` functions (run the learner's function on small CPU inputs, print one
``PASS ...`` line, or raise ``AssertionError`` with a hint), ``CHECKS`` (grade id -> check) and
``WRONG_ANSWERS`` (grade id -> plausible mistakes the check must reject; tests/test_grading.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from helpers.grading.common import as_number, reread

SECTIONS = {
    "ch07_pad_vocab": "chapter 07, section 2 (Padding the vocabulary)",
    "ch07_masked_sampling": "chapter 07, section 3 (Padded ids must never be sampled)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


PAD_CASES = [
    (50257, 64, 50304),
    (50257, 128, 50304),
    (50304, 64, 50304),
    (768, 64, 768),
    (1, 8, 8),
    (65, 64, 128),
]


def check_pad_vocab(fn: Callable[[int, int], int]) -> None:
    """Check ``pad_vocab(n, multiple) -> int``: the smallest multiple of ``multiple`` that is >= n.

    Raises:
        AssertionError: with a hint.
    """
    gid = "ch07_pad_vocab"
    for n, m, want in PAD_CASES:
        call = f"pad_vocab({n}, {m})"
        got = as_number(fn(n, m), call, _reread(gid))
        if got == want:
            continue
        if got < n:
            why = f"{call} returned {got:g} < {n}: rounding down drops real tokens; round up."
        elif n % m == 0:
            why = f"{call} returned {got:g}: {n} is already a multiple of {m}, so it must stay {n}."
        elif got % m:
            why = f"{call} returned {got:g}, which is not a multiple of {m}."
        else:
            why = f"{call} returned {got:g}, expected {want} (the *smallest* multiple >= n)."
        raise AssertionError(f"{why} {_reread(gid)}")
    print(
        f"PASS {gid}: pad_vocab rounds up to the next multiple for {len(PAD_CASES)} cases, "
        "aligned ones included"
    )


def check_masked_sampling(fn: Callable[..., Any]) -> None:
    """Check ``sample_next(logits, vocab_size, generator) -> (B, 1) int64``: samples from the
    softmax of the logits of real ids only. Run on a seeded untrained GPT with padded vocab whose
    padded rows are made the most likely ids, so only masking keeps them out; the samples must also
    vary.

    Raises:
        AssertionError: with a hint.
    """
    import torch

    from helpers.core.model import GPT, GPTConfig

    gid = "ch07_masked_sampling"
    torch.manual_seed(0)
    cfg = GPTConfig(
        block_size=16, vocab_size=100, vocab_multiple=64, n_layer=1, n_head=2, n_embd=16
    )
    model = GPT(cfg).eval()
    with torch.no_grad():  # make the padded ids by far the most likely: only masking keeps them out
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)
        model.lm_head.weight[100:] = 1.0
        logits, _ = model(torch.zeros(8, 4, dtype=torch.long))
    logits = logits[:, -1, :]  # (8, 128)
    if logits.argmax(dim=-1).max() < 100:
        raise AssertionError("internal: the padded ids are not the most likely ones")
    g = torch.Generator().manual_seed(0)
    samples = [fn(logits.clone(), 100, g) for _ in range(25)]
    if any(s is None for s in samples):
        raise AssertionError(f"sample_next returned None. {_reread(gid)}")
    ids = torch.cat([torch.as_tensor(s).reshape(-1) for s in samples])
    if ids.max().item() >= 100:
        raise AssertionError(
            f"sample_next returned id {ids.max().item()} >= vocab_size = 100: "
            f"padded ids must get logit -inf (or be sliced off) before sampling. {_reread(gid)}"
        )
    if ids.unique().numel() < 10:
        raise AssertionError(
            f"only {ids.unique().numel()} distinct ids in {ids.numel()} draws: "
            f"sample with torch.multinomial from the softmax, not argmax. {_reread(gid)}"
        )
    # The PASS line names no count of distinct ids: torch.multinomial draws differently across torch
    # versions, and a compared notebook output must depend only on what the learner wrote.
    print(
        f"PASS {gid}: {ids.numel()} samples from a padded untrained model, none >= vocab_size, "
        "at least 10 distinct ids"
    )


def _pad_always_add(n, m):
    return n + m - n % m


def _pad_round_down(n, m):
    return n // m * m


def _pad_next_always(n, m):
    return (n // m + 1) * m


def _sample_unmasked(logits, vocab_size, generator):
    import torch

    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


def _sample_off_by_one(logits, vocab_size, generator):
    import torch

    logits[:, vocab_size + 1 :] = float("-inf")
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


def _sample_argmax(logits, vocab_size, generator):
    return logits[:, :vocab_size].argmax(dim=-1, keepdim=True)


CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = {
    "ch07_pad_vocab": check_pad_vocab,
    "ch07_masked_sampling": check_masked_sampling,
}

WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch07_pad_vocab": [_pad_always_add, _pad_round_down, _pad_next_always],
    "ch07_masked_sampling": [_sample_unmasked, _sample_off_by_one, _sample_argmax],
}
