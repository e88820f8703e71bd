"""Fast generation: a KV cache beside the model, and a way to measure what it buys.

:meth:`GPT.generate <helpers.core.model.GPT.generate>` runs the whole context through the model for
every new token: token t costs a forward pass over t positions, so n tokens cost O(n²) positions.
The keys and values of past positions never change (attention is causal), so they can be kept: a
**KV cache**. Then a new token costs one position per layer: its query attends to the cached keys.

This module is a separate inference path that reuses the model's own modules and weights
(``model.transformer.h[i].attn.c_attn``, ``ln_1``, ``mlp`` ...); ``GPT.forward`` is unchanged.

- :class:`KVCache`: preallocated keys and values, (L, B, nh, T_max, hs) each, in the model's dtype:
  static shapes, so a compiled decode step never recompiles and never reallocates.
- :func:`prefill` runs the prompt once and fills the cache; :func:`decode_step` feeds one token at
  position ``pos``; :func:`generate_cached` samples exactly like ``GPT.generate``.
- The SDPA pitfall (:func:`pitfall_is_causal_with_cache`): ``is_causal=True`` aligns the causal
  mask top-left, so one query against many keys would see only key 0. A decode step uses an
  explicit boolean mask over the valid cache positions instead.
- :func:`generation_speed`: ms per token and tokens/s of recompute, cache and compiled cache.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from torch.nn import functional as F

from helpers.core.model import GPT, GPTConfig
from helpers.measure import hardware, timing

METHODS = ("recompute", "cache", "cache_compiled")
MODES = ("no_grad", "inference_mode")


def cache_bytes(config: GPTConfig, batch: int, t_max: int, dtype: torch.dtype) -> int:
    """Bytes of a KV cache: 2 · L · B · T · C · bytes per element.

    2 tensors (keys and values), L = n_layer, B = batch, T = ``t_max`` cached positions,
    C = n_embd (= nh · hs: every head keeps hs numbers per position). GPT-2 124M, B=1, T=1024, fp32:
    2 · 12 · 1 · 1024 · 768 · 4 = 75,497,472 bytes (75.5 MB).
    """
    size = torch.empty((), dtype=dtype).element_size()
    return 2 * config.n_layer * batch * t_max * config.n_embd * size


class KVCache:
    """Keys and values of every layer, preallocated: ``k`` and ``v`` are (L, B, nh, T_max, hs).

    Positions ``0 .. pos-1`` hold valid entries after a step at ``pos``; the rest is zeros that the
    attention mask hides. ``nbytes`` equals :func:`cache_bytes`.
    """

    def __init__(
        self,
        config: GPTConfig,
        batch: int,
        t_max: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        if t_max > config.block_size:
            raise ValueError(
                f"t_max={t_max} is larger than block_size={config.block_size}: the position "
                "embedding has no row for those positions"
            )
        shape = (config.n_layer, batch, config.n_head, t_max, config.head_size)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, nh, T_max, hs)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, nh, T_max, hs)
        self.t_max = t_max
        if self.k.device.type == "cuda":
            # A compiled step writes into these in place. Without a static address, inductor's
            # CUDA graphs are skipped for a step that mutates its inputs (it logs the reason).
            torch._dynamo.mark_static_address(self.k)
            torch._dynamo.mark_static_address(self.v)

    @classmethod
    def for_model(cls, model: GPT, batch: int, t_max: int) -> KVCache:
        """A cache in ``model``'s parameter dtype and device."""
        w = model.lm_head.weight
        return cls(model.config, batch, t_max, dtype=w.dtype, device=w.device)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def kv_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: int):
    """One new query against the cache: softmax(q kᵀ/√hs) v over the ``pos`` valid positions.

    q: (B, nh, 1, hs); k_cache, v_cache: (B, nh, T_max, hs); ``pos``: number of valid cached
    positions, the new one included. Returns (B, nh, 1, hs). ``is_causal=False`` on the valid
    prefix: the one query is the last position, so it may see every key in it (chapter 13's
    exercise; ``is_causal=True`` here would let it see key 0 only).
    """
    return F.scaled_dot_product_attention(q, k_cache[:, :, :pos], v_cache[:, :, :pos])


def _masked_attention(q, k, v, q_pos, manual: bool):
    """q: (B, nh, T, hs) at positions ``q_pos`` (T,); k, v: the whole cache (B, nh, T_max, hs).
    Key j is visible to the query at position p iff j <= p: an explicit (T, T_max) bool mask, so
    the shapes are static and the zeros beyond the valid positions are hidden."""
    key_pos = torch.arange(k.size(-2), device=q.device)
    mask = key_pos[None, :] <= q_pos[:, None]  # (T, T_max)
    if not manual:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, nh, T, T_max)
    att = att.masked_fill(~mask, float("-inf"))
    return F.softmax(att, dim=-1) @ v  # (B, nh, T, hs)


def _is_causal_pitfall(q, k, v, q_pos, manual: bool):
    """The wrong decode attention: SDPA ``is_causal=True`` on the valid prefix. With T queries and
    S > T keys its mask is the top-left lower triangle, so the last query sees keys 0..T-1 only."""
    n = int(q_pos[-1]) + 1
    return F.scaled_dot_product_attention(q, k[:, :, :n], v[:, :, :n], is_causal=True)


def forward_cached(
    model: GPT,
    idx: torch.Tensor,
    cache: KVCache,
    pos: int | torch.Tensor,
    attend: Callable = _masked_attention,
) -> torch.Tensor:
    """Run tokens ``idx`` (B, T) at positions ``pos .. pos+T-1`` through ``model``'s own blocks,
    writing their keys and values into ``cache`` and attending to positions ``0 .. pos+T-1``.

    ``pos``: an int or a 0-dim int64 tensor (a tensor keeps a compiled step's graph fixed).
    Returns the logits of the last position, (B, V_padded). Dropout is not applied (inference).
    """
    B, T = idx.shape
    dev = idx.device
    q_pos = torch.arange(T, device=dev) + pos  # (T,)
    manual = model.switches["attention"] == "manual"
    x = model.transformer.wte(idx) + model.transformer.wpe(q_pos)  # (B, T, C)
    C, nh = model.config.n_embd, model.config.n_head
    for i, block in enumerate(model.transformer.h):
        attn = block.attn
        q, k, v = attn.c_attn(block.ln_1(x)).split(C, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, nh, C // nh).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nh, C // nh).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, nh, C // nh).transpose(1, 2)  # (B, nh, T, hs)
        cache.k[i].index_copy_(2, q_pos, k.to(cache.k.dtype))  # positions on dim 2 (T_max)
        cache.v[i].index_copy_(2, q_pos, v.to(cache.v.dtype))
        y = attend(q, cache.k[i], cache.v[i], q_pos, manual)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        x = x + attn.c_proj(y)  # (B, T, C)
        x = x + block.mlp(block.ln_2(x))  # (B, T, C)
    x = model.transformer.ln_f(x[:, -1, :])  # (B, C)
    return model.lm_head(x)  # (B, V_padded)


def prefill(model: GPT, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """The prompt ``idx`` (B, T0) at positions 0..T0-1, into ``cache``; last logits (B, V_pad)."""
    return forward_cached(model, idx, cache, 0)


def decode_step(
    model: GPT, token: torch.Tensor, cache: KVCache, pos: int | torch.Tensor
) -> torch.Tensor:
    """One token (B, 1) at position ``pos`` (the cache holds 0..pos-1); its logits (B, V_padded)."""
    return forward_cached(model, token, cache, pos)


def sample_next(
    logits: torch.Tensor,
    vocab_size: int,
    temperature: float,
    top_k: int | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """The next ids (B, 1) from last-position logits (B, V_padded), the same arithmetic as
    ``GPT.generate``: fp32 / temperature, padded ids -inf, top-k, softmax, multinomial."""
    logits = logits.float() / temperature
    logits[:, vocab_size:] = float("-inf")  # padded ids do not exist in the tokenizer
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, vocab_size))
        logits[logits < v[:, [-1]]] = float("-inf")
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)


@torch.no_grad()
def generate_cached(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = 50,
    generator: torch.Generator | None = None,
    step: Callable | None = None,
) -> torch.Tensor:
    """``GPT.generate`` with a KV cache: the same tokens (greedy with ``top_k=1``, or sampled with
    the same ``generator``), (B, T0 + max_new_tokens) int64.

    ``step``: the decode step, ``decode_step`` by default (or :func:`compiled_decode_step`'s).
    The cache holds T0 + max_new_tokens positions, allocated once.

    Raises:
        ValueError: temperature <= 0, or T0 + max_new_tokens > block_size (``GPT.generate`` crops
            the context to the last block_size tokens and recomputes; a cache cannot drop its first
            position without recomputing every later one, so it refuses instead).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B, T0 = idx.shape
    if T0 + max_new_tokens > model.config.block_size:
        raise ValueError(
            f"prompt length {T0} + max_new_tokens {max_new_tokens} > block_size "
            f"{model.config.block_size}: a KV cache does not crop the context; ask for at most "
            f"{model.config.block_size - T0} new tokens, or use GPT.generate (it crops)"
        )
    if max_new_tokens <= 0:
        return idx
    step = step or decode_step
    was_training = model.training
    model.eval()
    V = model.config.vocab_size
    cache = KVCache.for_model(model, B, T0 + max_new_tokens)
    out = torch.empty(B, T0 + max_new_tokens, dtype=idx.dtype, device=idx.device)
    out[:, :T0] = idx
    logits = prefill(model, idx, cache)
    for t in range(T0, T0 + max_new_tokens):
        nxt = sample_next(logits, V, temperature, top_k, generator)  # (B, 1)
        out[:, t : t + 1] = nxt
        if t + 1 < T0 + max_new_tokens:  # the last token is never fed back
            pos = torch.tensor(t, device=idx.device)  # a tensor: one graph for every position
            logits = step(model, nxt, cache, pos)
    model.train(was_training)
    return out


def compiled_decode_step(device: torch.device | str) -> tuple[Callable | None, str]:
    """``torch.compile(decode_step)``, and the mode or why not (the compile runs on first call).

    Shapes are static (the cache is preallocated, the position is a tensor), so one graph serves
    every step. On CUDA the mode is ``"reduce-overhead"`` (CUDA graphs: a decode step launches
    hundreds of small kernels, and one graph replay replaces their launches; the cache's tensors
    have static addresses, :class:`KVCache`), not measured on a GPU in this module's tests; on a
    CPU the default mode.
    Returns (None, reason) when :func:`helpers.measure.hardware.compile_support` says no.
    """
    device = torch.device(device)
    ok, why = hardware.compile_support(device)
    if not ok:
        return None, why
    mode = "reduce-overhead" if device.type == "cuda" else "default"
    return torch.compile(decode_step, mode=mode, fullgraph=True), f"torch.compile mode={mode!r}"


def pitfall_is_causal_with_cache(model: GPT, idx: torch.Tensor) -> dict[str, float]:
    """How wrong ``is_causal=True`` is for a decode step, against full recomputation.

    Prefills ``idx[:, :-1]`` (B, T0-1), decodes the last token once with the right attention (a
    boolean mask over the valid positions) and once with SDPA ``is_causal=True`` on the valid
    prefix, and compares both last-position logits with ``model(idx)``'s. Returns
    ``{"wrong_max_abs_diff": ..., "right_max_abs_diff": ...}`` (logit units): the wrong one is
    large (its one query saw key 0 only), the right one is rounding (~1e-6 in fp32).
    """
    was_training = model.training
    model.eval()
    B, T = idx.shape
    with torch.no_grad():
        full = model(idx)[0][:, -1, :].float()
        out = {}
        for name, attend in (("wrong", _is_causal_pitfall), ("right", _masked_attention)):
            cache = KVCache.for_model(model, B, T)
            forward_cached(model, idx[:, :-1], cache, 0)
            last = forward_cached(model, idx[:, -1:], cache, T - 1, attend=attend).float()
            out[f"{name}_max_abs_diff"] = (last - full).abs().max().item()
    model.train(was_training)
    return out


def generation_speed(
    model: GPT,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    method: str = "cache",
    device: torch.device | str = "cpu",
    mode: str = "no_grad",
    warmup: int = 1,
    iters: int = 3,
) -> dict:
    """Time generating ``new_tokens`` after a random prompt (batch, prompt_len), greedy (top_k=1),
    with :func:`helpers.measure.timing.measure` (``warmup`` untimed runs, median of ``iters``).

    ``method``: "recompute" (``GPT.generate``), "cache" (:func:`generate_cached`) or
    "cache_compiled" (with :func:`compiled_decode_step`; compiled during warm-up). ``mode``:
    "no_grad" (``model.eval()`` + ``torch.no_grad()``) or "inference_mode"
    (``torch.inference_mode()``: no version counters or view tracking either).

    Returns {"method", "mode", "batch", "status" ("measured" | "skipped"), "reason",
    "ms_per_token" (one run's median ms / new_tokens, prefill included), "tokens_per_s"
    (batch · new_tokens per second), "warmup_ms" (the untimed runs: the compile is in the first),
    "peak_mem_bytes" (CUDA peak allocated during the timed runs,
    None on a CPU)}. Model on ``device`` already.

    Raises:
        ValueError: an unknown method or mode.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    device = torch.device(device)
    row = dict(method=method, mode=mode, batch=batch, status="skipped", reason="")
    row.update(ms_per_token=None, tokens_per_s=None, peak_mem_bytes=None, warmup_ms=[])
    step = None
    if method == "cache_compiled":
        step, why = compiled_decode_step(device)
        row["reason"] = why
        if step is None:
            return row
    gen = torch.Generator(device="cpu").manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=gen)
    prompt = prompt.to(device)
    model.eval()

    def run() -> torch.Tensor:
        ctx = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
        with ctx:
            if method == "recompute":
                return model.generate(prompt, new_tokens, top_k=1)
            return generate_cached(model, prompt, new_tokens, top_k=1, step=step)

    with warnings.catch_warnings():
        # the compile (in the first run) suggests TF32; the course times fp32 here on purpose
        warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores")
        warm = timing.measure(run, device, warmup=0, iters=warmup) if warmup else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # the timed runs' peak, not the compile's
    t = timing.measure(run, device, warmup=0, iters=iters)
    ms = t.median_ms
    row.update(
        status="measured",
        reason=row["reason"] or "ok",
        ms_per_token=ms / new_tokens,
        warmup_ms=warm.times_ms if warm else [],
        tokens_per_s=timing.tokens_per_second(batch * new_tokens, ms),
        peak_mem_bytes=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
    )
    return row
