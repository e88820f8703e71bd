"""Graded checks of chapter 07 (vocab padding): padding a built model's vocabulary and
never sampling a padded id.

Every chapter module has the same shape: ``SECTIONS`` (grade id -> the section a failed check's hint
points to), the ``check_*`` functions (run the learner's function on small CPU inputs, print one
``PASS ...`` line, or raise ``AssertionError`` with a hint), ``CHECKS`` (grade id -> check) and
``WRONG_ANSWERS`` (grade id -> plausible mistakes the check must reject; tests/test_grading.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from helpers.grading.common import passed, reread, run_learner

SECTIONS = {
    "ch07_pad_vocab": "chapter 07, section 2 (Padding the vocabulary)",
    "ch07_masked_sampling": "chapter 07, section 3 (Padded ids must never be sampled)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


# (vocab size V, multiple, padded rows): unaligned, already aligned, a small multiple
PAD_CASES = [(100, 64, 128), (128, 64, 128), (100, 8, 104)]


def _tiny_unpadded_gpt(vocab_size: int):
    import torch

    from helpers.core.model import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=vocab_size, n_layer=1, n_head=2, n_embd=16))


def check_pad_vocab(fn: Callable[..., Any]) -> None:
    """Check ``pad_model_vocab(gpt, multiple)``, padding a built GPT's tied embedding / LM head in
    place, on tiny GPTs on the CPU (vocab 100 to a multiple of 64 and of 8; vocab 128, already
    aligned): one shared ``nn.Parameter`` of the smallest multiple >= V rows, the old rows first and
    zeros after, ``gpt.config.vocab_multiple`` set, and the logits of the real ids unchanged (the
    padded ones 0) in a forward pass.

    Raises:
        AssertionError: with a hint.
    """
    import torch

    gid = "ch07_pad_vocab"
    for V, m, want in PAD_CASES:
        gpt = _tiny_unpadded_gpt(V)
        old = gpt.lm_head.weight.detach().clone()  # (V, C)
        idx = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ref_logits, _ = gpt(idx)  # (B, T, V)
        call = f"pad_model_vocab(gpt with V={V}, {m})"
        # the learner pads a copy of gpt in the submission's kernel when grading: what comes back
        # is the padded weights, the config's size and a forward's logits, judged here
        got = run_learner(fn, _harness_pad_vocab, gpt, m, idx)
        head, wte = got["lm_head"], got["wte"]
        if not (got["tied"] and torch.equal(head, wte)):
            raise AssertionError(
                f"{call}: gpt.lm_head.weight and gpt.transformer.wte.weight are no longer one "
                "tensor: weight tying is broken (two copies to store, update and keep apart). "
                f"Make one nn.Parameter and assign that same object to both. {_reread(gid)}"
            )
        if not (got["is_parameter"] and got["requires_grad"]):
            raise AssertionError(
                f"{call}: the padded weight is a {got['type']} without gradients: wrap it "
                f"in nn.Parameter so that the optimizer trains it. {_reread(gid)}"
            )
        rows = head.shape[0]
        if rows != want:
            if rows < V:
                why = f"rounding down drops real tokens; round up to a multiple of {m}"
            elif V % m == 0:
                why = f"{V} is already a multiple of {m}, so it must stay {V}"
            elif rows % m:
                why = f"{rows} is not a multiple of {m}"
            else:
                why = f"expected {want}, the *smallest* multiple of {m} that is >= {V}"
            raise AssertionError(f"{call}: the weight has {rows} rows: {why}. {_reread(gid)}")
        if tuple(head.shape) != (want, old.shape[1]) or not torch.equal(head[:V], old):
            raise AssertionError(
                f"{call}: rows 0..{V - 1} are not the old weight's rows: copy the old (V, C) "
                f"weight into the first V rows, so that token id i keeps row i. {_reread(gid)}"
            )
        if rows > V and bool((head[V:] != 0).any()):  # NaN rows are not zero either
            raise AssertionError(
                f"{call}: the padded rows are not zero: start them at zero, as the course's "
                "model does (their logits start at 0, and training only pushes them down). "
                f"{_reread(gid)}"
            )
        if got["padded_vocab_size"] != rows:
            raise AssertionError(
                f"{call}: gpt.config.padded_vocab_size is {got['padded_vocab_size']}, but the "
                f"weight has {rows} rows: set gpt.config.vocab_multiple = {m}, so that code "
                "reading the config (chapter 03's memory estimate, for one) sees the padded size. "
                f"{_reread(gid)}"
            )
        logits = got["logits"]
        if not isinstance(logits, torch.Tensor):
            raise AssertionError(
                f"{call}: the padded model's forward raised {' '.join(str(logits).split())}. "
                f"{_reread(gid)}"
            )
        if tuple(logits.shape) != (*idx.shape, want) or not (
            torch.allclose(logits[..., :V], ref_logits, atol=1e-6) and (logits[..., V:] == 0).all()
        ):
            raise AssertionError(
                f"{call}: the padded model's logits of real ids differ from the unpadded model's. "
                f"{_reread(gid)}"
            )
    passed(
        gid,
        f"{len(PAD_CASES)} tiny GPTs padded in place (aligned one included): one tied "
        "weight, old rows kept, zero padded rows, the same logits for real ids",
    )


def _harness_pad_vocab(fn, gpt, multiple, idx):
    """``fn(gpt, multiple)`` (padding ``gpt`` in place; a module it returns is taken as the padded
    model), then a forward of ``idx``; the harness of ``ch07_pad_vocab``.

    Returns a dict of what the padded model holds:
        ``"lm_head"``, ``"wte"``: ``gpt.lm_head.weight`` and ``gpt.transformer.wte.weight``,
        detached ((rows, C) fp32 for a right answer);
        ``"tied"``: whether they are one object (bool); ``"type"``: the class name of
        ``gpt.lm_head.weight``; ``"is_parameter"``: whether it is an ``nn.Parameter`` (bool);
        ``"requires_grad"``: its requires_grad (bool);
        ``"padded_vocab_size"``: ``gpt.config.padded_vocab_size`` (int);
        ``"logits"``: ``gpt(idx)``'s logits under no_grad ((B, T, rows) fp32), or the text of the
        exception that forward raised (str).
    """
    import torch

    returned = fn(gpt, multiple)
    if isinstance(returned, torch.nn.Module):  # padded in place and returned: either is fine
        gpt = returned
    head, wte = gpt.lm_head.weight, gpt.transformer.wte.weight
    try:
        with torch.no_grad():
            logits = gpt(idx)[0]
    except Exception as exc:  # e.g. an embedding with fewer rows than the ids: the check says
        logits = f"{type(exc).__name__}: {exc}"[:500]
    return {
        "lm_head": head.detach(),
        "wte": wte.detach(),
        "tied": head is wte,
        "type": type(head).__name__,
        "is_parameter": isinstance(head, torch.nn.Parameter),
        "requires_grad": bool(head.requires_grad),
        "padded_vocab_size": gpt.config.padded_vocab_size,
        "logits": logits,
    }


def _harness_draws(fn, logits, vocab_size, seed, n):
    """``n`` calls ``fn(logits.clone(), vocab_size, generator)``, all with one ``torch.Generator``
    seeded with ``seed`` here (a generator sent from the checker would arrive in the same state at
    every call, so every call would draw the same ids); the harness of ``ch07_masked_sampling``.

    Returns:
        a list of ``n``: what each call returned, as a tensor (``torch.as_tensor``; (B, 1) int64
        for a right answer), or None where it returned None.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    samples = [fn(logits.clone(), vocab_size, g) for _ in range(n)]
    return [None if s is None else torch.as_tensor(s) for s in samples]


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
    # a real id made far more likely than the others, chosen afresh each time (a sampler cannot
    # know it without reading the logits)
    favourite = random.Random().randrange(100)
    torch.manual_seed(0)
    cfg = GPTConfig(
        block_size=16, vocab_size=100, vocab_multiple=64, n_layer=1, n_head=2, n_embd=16
    )
    model = GPT(cfg).eval()
    with torch.no_grad():  # make the padded ids by far the most likely: only masking keeps them out
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)
        model.lm_head.weight[100:] = 1.0
        model.lm_head.weight[favourite] = 0.25  # logit 4.0 over the other real ids' ~0
        logits, _ = model(torch.zeros(8, 4, dtype=torch.long))
    logits = logits[:, -1, :]  # (8, 128)
    if logits.argmax(dim=-1).max() < 100:
        raise AssertionError("internal: the padded ids are not the most likely ones")
    # the 25 draws run beside the learner's function, from one generator seeded there with 0
    samples = run_learner(fn, _harness_draws, logits, 100, 0, 25)
    if any(s is None for s in samples):
        raise AssertionError(f"sample_next returned None. {_reread(gid)}")
    shapes = {tuple(torch.as_tensor(s).shape) for s in samples}
    if shapes != {(8, 1)}:
        raise AssertionError(
            f"sample_next(logits of shape (8, 128), ...) returned shape "
            f"{sorted(shapes)[0]}, expected (8, 1): one next id per row, as generate() appends "
            f"it (torch.multinomial(probs, num_samples=1)). {_reread(gid)}"
        )
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
    p = torch.softmax(logits[:, :100].float(), dim=-1)[:, favourite].mean().item()
    drawn = (ids == favourite).float().mean().item()
    if drawn < p / 2:  # a right sampler draws it about p of the time (p ~0.35: ~70 of 200)
        raise AssertionError(
            f"id {favourite} has probability {p:.2f} under the softmax of the real ids' logits "
            f"but was drawn in {drawn:.0%} of the draws: sample from softmax(logits) with "
            f"torch.multinomial, not uniformly. {_reread(gid)}"
        )
    # The PASS line names no count of distinct ids: torch.multinomial draws differently across torch
    # versions, and a compared notebook output must depend only on what the learner wrote.
    passed(
        gid,
        f"{ids.numel()} samples from a padded untrained model, none >= vocab_size, "
        "at least 10 distinct ids",
    )


def _padded_weight(gpt, rows, fill=None, front=False):
    import torch

    old = gpt.lm_head.weight.detach()
    extra = torch.zeros(rows - old.shape[0], old.shape[1]) if fill is None else fill
    return torch.nn.Parameter(torch.cat([extra, old] if front else [old, extra]))


def _rows(gpt, multiple):
    V = gpt.config.vocab_size
    return -(-V // multiple) * multiple


def _pad_untied(gpt, multiple):
    w = _padded_weight(gpt, _rows(gpt, multiple))
    gpt.lm_head.weight = w
    gpt.transformer.wte.weight = _copy_parameter(w)
    gpt.config.vocab_multiple = multiple


def _copy_parameter(w):
    import torch

    return torch.nn.Parameter(w.detach().clone())


def _pad_lm_head_only(gpt, multiple):
    gpt.lm_head.weight = _padded_weight(gpt, _rows(gpt, multiple))
    gpt.config.vocab_multiple = multiple


def _pad_round_down(gpt, multiple):
    import torch

    rows = gpt.config.vocab_size // multiple * multiple
    w = torch.nn.Parameter(gpt.lm_head.weight.detach()[:rows].clone())
    gpt.lm_head.weight = gpt.transformer.wte.weight = w
    gpt.config.vocab_multiple = multiple


def _pad_always_add(gpt, multiple):
    V = gpt.config.vocab_size
    w = _padded_weight(gpt, V + multiple - V % multiple)
    gpt.lm_head.weight = gpt.transformer.wte.weight = w
    gpt.config.vocab_multiple = multiple


def _pad_random_rows(gpt, multiple):
    import torch

    V, C = gpt.lm_head.weight.shape
    fill = torch.randn(_rows(gpt, multiple) - V, C) * 0.02
    w = _padded_weight(gpt, _rows(gpt, multiple), fill=fill)
    gpt.lm_head.weight = gpt.transformer.wte.weight = w
    gpt.config.vocab_multiple = multiple


def _pad_rows_in_front(gpt, multiple):
    w = _padded_weight(gpt, _rows(gpt, multiple), front=True)
    gpt.lm_head.weight = gpt.transformer.wte.weight = w
    gpt.config.vocab_multiple = multiple


def _pad_config_unchanged(gpt, multiple):
    w = _padded_weight(gpt, _rows(gpt, multiple))
    gpt.lm_head.weight = gpt.transformer.wte.weight = w


def _sample_unmasked(logits, vocab_size, generator):
    import torch

    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


def _sample_off_by_one(logits, vocab_size, generator):
    import torch

    logits[:, vocab_size + 1 :] = float("-inf")
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


def _sample_argmax(logits, vocab_size, generator):
    return logits[:, :vocab_size].argmax(dim=-1, keepdim=True)


def _sample_uniform(logits, vocab_size, generator):
    import torch

    return torch.randint(0, vocab_size, (logits.shape[0], 1), generator=generator)


def _sample_three(logits, vocab_size, generator):
    import torch

    probs = torch.softmax(logits[:, :vocab_size].float(), dim=-1)
    return torch.multinomial(probs, num_samples=3, generator=generator)


CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = {
    "ch07_pad_vocab": check_pad_vocab,
    "ch07_masked_sampling": check_masked_sampling,
}

WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch07_pad_vocab": [
        _pad_untied,
        _pad_lm_head_only,
        _pad_round_down,
        _pad_always_add,
        _pad_random_rows,
        _pad_rows_in_front,
        _pad_config_unchanged,
    ],
    "ch07_masked_sampling": [
        _sample_unmasked,
        _sample_off_by_one,
        _sample_argmax,
        _sample_three,
        _sample_uniform,
    ],
}
