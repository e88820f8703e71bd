"""GPT-2 (124M): the one model of the course.

The architecture of Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"
(https://cdn.openai.com/better-language-models/language_models_are_unsupervised_multitask_learners.pdf):
pre-LayerNorm transformer blocks, GELU (tanh approximation), learned position embeddings, and the
token embedding tied to the LM head.

:class:`GPTConfig` is the shape (its defaults *are* GPT-2 124M). The speed switches that act inside
the model are keyword arguments of :class:`GPT` (their records are in :mod:`helpers.switches`,
``where="model"``); ``GPT.__init__`` picks each mechanism once, so ``forward`` reads top to bottom:

- ``attention``: ``"manual"`` materialises the (T, T) scores with a causal mask
  (:func:`manual_attention`); ``"sdpa"`` calls ``F.scaled_dot_product_attention(...,
  is_causal=True)``, which lets PyTorch pick a fused kernel (FlashAttention, memory-efficient,
  cuDNN) that never stores the scores (chapter 06).
- ``loss_kernel``: ``"pytorch"`` (``F.cross_entropy``), ``"triton"`` (the hand-written kernel of
  :mod:`helpers.core.kernels`) or ``"fused"`` (LM head and loss in chunks, chapter 12).
- ``residual_dtype``, ``detach_logits``, ``lm_head_fp8``, ``mlp_fp8``, ``qkv_grad``,
  ``fp8_fast_accum``, ``checkpoint_every``, ``checkpoint_policy``: chapters 09 and 12.

``GPTConfig.vocab_multiple`` pads the embedding / LM-head rows from 50257 up to a multiple (64 ->
50304) so the LM-head matmul has tensor-core friendly shapes (chapter 07). Targets never reach the
padded ids, training pushes their logits down, and :meth:`GPT.generate` masks them out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.utils.checkpoint
from torch.nn import functional as F

from helpers import switches
from helpers.core import recompute

GPT2_VOCAB_SIZE = 50257  # 50,000 BPE merges + 256 byte tokens + <|endoftext|>
# The switches whose mechanism is in this file, from the registry (where="model").
MODEL_SWITCHES: tuple[str, ...] = tuple(s.field for s in switches.SWITCHES if s.where == "model")


def pad_to_multiple(n: int, multiple: int) -> int:
    """Smallest integer >= ``n`` that is a multiple of ``multiple``: ``pad_to_multiple(50257, 64)``
    is 50304.

    Raises:
        ValueError: if ``n`` < 1 or ``multiple`` < 1.
    """
    if n < 1 or multiple < 1:
        raise ValueError(
            f"pad_to_multiple needs n >= 1 and multiple >= 1, got n={n}, multiple={multiple}"
        )
    return ((n + multiple - 1) // multiple) * multiple


@dataclass
class GPTConfig:
    """Shape of the model. The defaults *are* GPT-2 124M."""

    block_size: int = 1024  # longest sequence (T) the position embedding covers
    vocab_size: int = GPT2_VOCAB_SIZE  # real vocabulary: ids 0..vocab_size-1 exist in the tokenizer
    vocab_multiple: int = 1  # pad embedding/LM-head rows to a multiple of this (1 = no padding)
    n_layer: int = 12  # transformer blocks (L)
    n_head: int = 12  # attention heads per block (H)
    n_embd: int = 768  # residual stream width (C); head size Q = n_embd // n_head = 64
    dropout: float = 0.0  # GPT-2 pre-training used 0.1; speed work uses 0 (no RNG in the step)

    def __post_init__(self) -> None:
        for name in ("block_size", "vocab_size", "vocab_multiple", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding / LM head: ``vocab_size`` rounded up to ``vocab_multiple``."""
        return pad_to_multiple(self.vocab_size, self.vocab_multiple)

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head


def manual_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal_mask: torch.Tensor | None = None,
    dropout: nn.Module | None = None,
) -> torch.Tensor:
    """Causal attention with the (B, nh, T, T) score matrix in memory: softmax(q kᵀ/√hs + mask) v.

    q, k, v: (B, nh, T, hs); returns (B, nh, T, hs). ``causal_mask``: a (T', T') bool lower
    triangle with T' >= T (made here when None); ``dropout`` is applied to the probabilities.
    """
    T, hs = q.size(-2), q.size(-1)
    if causal_mask is None:
        causal_mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
    if causal_mask.size(-1) != T:
        causal_mask = causal_mask[:T, :T]
    att = att.masked_fill(~causal_mask, float("-inf"))
    att = F.softmax(att, dim=-1)
    if dropout is not None:
        att = dropout(att)
    return att @ v  # (B, nh, T, hs)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0
) -> torch.Tensor:
    """Causal attention through ``F.scaled_dot_product_attention(is_causal=True)``: no mask tensor,
    and the fused kernels keep no (T, T) tensor for backward. q, k, v and the result:
    (B, nh, T, hs)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)


def _bf16_autocast(device_type: str) -> bool:
    """Whether bf16 autocast is on for ``device_type`` (torch.compile reads it as a constant and
    guards on it, no graph break)."""
    return (
        torch.is_autocast_enabled(device_type)
        and torch.get_autocast_dtype(device_type) == torch.bfloat16
    )


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused QKV projection; ``attention`` picks the
    kernel."""

    def __init__(self, config: GPTConfig, attention: str = "manual", qkv_grad: bool = False):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.c_proj.RESIDUAL_SCALE_INIT = True  # GPT-2 scales this init by 1/sqrt(2 * n_layer)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.attend = self._sdpa if attention == "sdpa" else self._manual
        self.qkv_grad = qkv_grad
        if qkv_grad:  # rung "+ one-pass QKV grad" (GPT checks its requirements)
            from helpers.core.kernels import qkv_grad as one_pass  # imports Triton: only here

            self.one_pass_heads = one_pass.qkv_heads
        if attention == "manual":
            mask = torch.tril(torch.ones(config.block_size, config.block_size, dtype=torch.bool))
            self.register_buffer("causal_mask", mask, persistent=False)

    def _manual(self, q, k, v):
        return manual_attention(q, k, v, self.causal_mask, self.attn_dropout)

    def _sdpa(self, q, k, v):
        return sdpa_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        """The QKV projection: x (B, T, C) -> q, k, v side by side (B, T, 3C). One method, so an
        experiment (benchmarks/bias_in_matmul.py) can replace the projection alone."""
        return self.c_attn(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()  # (B, T, C)
        if self.qkv_grad and _bf16_autocast(x.device.type):
            # the same q, k, v; c_attn's backward concatenates dq, dk, dv at once. Its c_attn is a
            # bf16 matmul, as bf16 autocast's: without that autocast (generation after training,
            # fp32 evaluation) the plain path below computes them in the caller's dtype
            w, b = self.c_attn.weight, self.c_attn.bias
            q, k, v = self.one_pass_heads(x, w, b, self.n_head)  # 3 x (B, nh, T, hs) bf16
        else:
            q, k, v = self._qkv(x).split(self.n_embd, dim=2)  # 3 x (B, T, C)
            hs = C // self.n_head
            q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
            k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
            v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        y = self.attend(q, k, v)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward: C -> 4C -> GELU(tanh) -> C."""

    def __init__(self, config: GPTConfig, fp8: bool = False, grad_fast_accum: bool = False):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2 used the tanh approximation
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.c_proj.RESIDUAL_SCALE_INIT = True
        self.dropout = nn.Dropout(config.dropout)
        self.fp8 = fp8
        self.grad_fast_accum = grad_fast_accum  # rung "+ fp8 fast accum"
        if fp8:  # rung "+ fp8 MLP" (GPT checks its requirements)
            from helpers.core import kernels  # imports Triton: only when the rung is asked for

            self.mlp_fp8 = kernels.mlp_fp8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8:  # the same function, with fp8 matmuls and one-pass GELU kernels
            w = (self.c_fc.weight, self.c_fc.bias, self.c_proj.weight, self.c_proj.bias)
            return self.mlp_fp8(x, *w, grad_fast_accum=self.grad_fast_accum)  # (B, T, C) bf16
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # (B, T, C)


class Block(nn.Module):
    """One pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(
        self,
        config: GPTConfig,
        attention: str = "manual",
        mlp_fp8: bool = False,
        qkv_grad: bool = False,
        fp8_fast_accum: bool = False,
    ):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config, attention, qkv_grad)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config, fp8=mlp_fp8, grad_fast_accum=fp8_fast_accum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))  # (B, T, C)
        x = x + self.mlp(self.ln_2(x))  # (B, T, C)
        return x


def _pytorch_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets)  # fp32 math whatever the logits' dtype


class GPT(nn.Module):
    """GPT-2 language model.

    ``GPT(config, **switches)``: ``config`` the shape; the keyword arguments are the model's speed
    switches (:data:`MODEL_SWITCHES`, defaults = the fp32 baseline), checked against their records:
    ``attention`` ("manual" | "sdpa"), ``loss_kernel`` ("pytorch" | "triton" | "fused"),
    ``residual_dtype`` ("fp32" | "bf16": the residual stream in bf16 under bf16 autocast),
    ``detach_logits`` (return logits.detach() with targets: no logits-sized gradient input to
    backward), ``lm_head_fp8`` (with loss_kernel="fused": the LM head's matmuls in fp8),
    ``mlp_fp8`` (the MLP's forward and input-gradient matmuls in fp8, :mod:`helpers.core.kernels.
    fp8_mlp`; no dropout), ``qkv_grad`` (``c_attn``'s backward concatenates dq, dk, dv and sums its
    bias gradient in one kernel, :mod:`helpers.core.kernels.qkv_grad`; n_embd a multiple of 256;
    taken under bf16 autocast, the plain path otherwise), ``fp8_fast_accum`` (with mlp_fp8: the
    MLP's two input-gradient matmuls with fast fp8 accumulation, as its forward's) and
    ``checkpoint_every`` (0 = off, k = recompute every k-th block in backward) and
    ``checkpoint_policy`` (what a checkpointed block keeps: "block" = only its input, "selective" =
    also its matmul and attention outputs, :mod:`helpers.core.recompute`).

    ``forward(idx, targets=None) -> (logits | None, loss)``:
        idx: (B, T) int64 token ids, T <= block_size.
        targets: optional (B, T) int64 next-token ids (ids < vocab_size).
        logits: (B, T, padded_vocab_size) in the compute dtype (fp32, or bf16/fp16 under autocast);
            detached when targets are given and ``detach_logits``; None when targets are given and
            ``loss_kernel="fused"`` (the loss never keeps them whole).
        loss: scalar fp32 mean cross-entropy in nats, or None without targets.

    Raises:
        ValueError: a switch value its record does not accept, ``lm_head_fp8`` without
            ``loss_kernel="fused"`` or with a width or vocabulary that is not a multiple of 16,
            ``mlp_fp8`` with dropout, a width that is not a multiple of 16 or over 1024,
            ``qkv_grad`` with n_embd not a multiple of 256, ``fp8_fast_accum`` without
            ``mlp_fp8``;
            in forward, T > block_size.
    """

    def __init__(
        self,
        config: GPTConfig,
        attention: str = "manual",
        loss_kernel: str = "pytorch",
        residual_dtype: str = "fp32",
        detach_logits: bool = False,
        lm_head_fp8: bool = False,
        mlp_fp8: bool = False,
        qkv_grad: bool = False,
        fp8_fast_accum: bool = False,
        checkpoint_every: int = 0,
        checkpoint_policy: str = "block",
    ):
        super().__init__()
        chosen = dict(
            attention=attention,
            loss_kernel=loss_kernel,
            residual_dtype=residual_dtype,
            detach_logits=detach_logits,
            lm_head_fp8=lm_head_fp8,
            mlp_fp8=mlp_fp8,
            qkv_grad=qkv_grad,
            fp8_fast_accum=fp8_fast_accum,
            checkpoint_every=checkpoint_every,
            checkpoint_policy=checkpoint_policy,
        )
        for name, value in chosen.items():
            problem = switches.get(name).problem(value, owner="GPT")
            if problem is not None:
                raise ValueError(problem)
        if (problem := switches.requirement_problem(chosen, owner="GPT")) is not None:
            raise ValueError(problem)
        if lm_head_fp8 and (config.padded_vocab_size % 16 or config.n_embd % 16):
            raise ValueError(
                "GPT(lm_head_fp8=True): fp8 matmuls need multiples of 16, "
                f"got n_embd={config.n_embd} and {config.padded_vocab_size} LM-head rows: "
                "pad the vocabulary (vocab_multiple=64)"
            )
        if mlp_fp8:
            from helpers.core.kernels import fp8_mlp  # imports Triton: only for this switch

            wrong = [
                w
                for w in (
                    config.dropout and "it has no dropout: use dropout=0",
                    fp8_mlp.width_problem(config.n_embd),
                )
                if w
            ]
            if wrong:
                raise ValueError(f"GPT(mlp_fp8=True): {'; '.join(wrong)}")
        if qkv_grad:
            from helpers.core.kernels import qkv_grad as one_pass  # imports Triton: only here

            if config.n_embd % one_pass.COLS:
                raise ValueError(
                    f"GPT(qkv_grad=True): its kernel copies {one_pass.COLS} columns at a time, so "
                    f"n_embd must be a multiple of {one_pass.COLS}, got {config.n_embd}"
                )
        self.config = config
        self.switches = chosen  # what this model was built with, for reports and tests
        # One seed drawn from the global RNG before any module exists (so torch.manual_seed fixes
        # the model), then a private generator: the weights do not depend on what construction
        # consumed.
        init_seed = int(torch.randint(0, 2**31 - 1, (1,), device="cpu").item())
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.padded_vocab_size, config.n_embd),  # token embedding
                wpe=nn.Embedding(config.block_size, config.n_embd),  # position embedding
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList(
                    [
                        Block(config, attention, mlp_fp8, qkv_grad, fp8_fast_accum)
                        for _ in range(config.n_layer)
                    ]
                ),
                ln_f=nn.LayerNorm(config.n_embd),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying (Press & Wolf 2017)
        self._init_weights(init_seed)
        # The mechanisms, chosen once: forward calls them without asking which.
        self.recomputed = {
            i for i in range(config.n_layer) if checkpoint_every and i % checkpoint_every == 0
        }
        # the selective policy is a context_fn of torch.utils.checkpoint (helpers.core.recompute)
        self.checkpoint_options = (
            {"context_fn": recompute.selective_context} if checkpoint_policy == "selective" else {}
        )
        self.residual_bf16 = residual_dtype == "bf16"
        self.detach_logits = detach_logits
        self.lm_head_fp8 = lm_head_fp8
        if loss_kernel == "pytorch":
            self.cross_entropy = _pytorch_cross_entropy
        else:
            from helpers.core import kernels  # imports Triton: only when a kernel is asked for

            self.cross_entropy = kernels.cross_entropy
            self.linear_cross_entropy = kernels.linear_cross_entropy
        self.head = self._fused_head if loss_kernel == "fused" else self._lm_head

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases, LayerNorm (1, 0); residual projections
        (attn.c_proj, mlp.c_proj) get std 0.02/sqrt(2*n_layer) because each block adds two of them
        to the residual stream (GPT-2 paper, section 2.3).

        The tied token embedding is drawn last, real rows first, so every other weight is identical
        with and without vocab padding; padded rows start at zero (their logits start at 0 and
        training pushes them down, since targets never hit them)."""
        device = self.lm_head.weight.device
        gen = None if device.type == "meta" else torch.Generator(device=device).manual_seed(seed)
        for module in self.modules():
            if module is self.lm_head or module is self.transformer.wte:
                continue
            if isinstance(module, nn.Linear):
                std = 0.02
                if getattr(module, "RESIDUAL_SCALE_INIT", False):
                    std *= (2 * self.config.n_layer) ** -0.5
                module.weight.normal_(0.0, std, generator=gen)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, 0.02, generator=gen)
        wte = self.transformer.wte.weight
        wte[: self.config.vocab_size].normal_(0.0, 0.02, generator=gen)
        wte[self.config.vocab_size :].zero_()

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        B, T = idx.size()  # (B, T)
        if T > self.config.block_size:
            raise ValueError(
                f"Sequence length T={T} is larger than block_size={self.config.block_size}: "
                f"use T <= {self.config.block_size} (crop the input) or build a GPTConfig with a "
                "larger block_size."
            )
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C) fp32
        x = self.transformer.drop(self._residual_stream(x))
        for i, block in enumerate(self.transformer.h):
            if i in self.recomputed and torch.is_grad_enabled():
                # keep only the block's input (the selective context also keeps its matmul
                # outputs, helpers.core.recompute); the rest is recomputed during backward.
                # use_reentrant=False: parameters get gradients even when x needs none (chapter 09)
                x = torch.utils.checkpoint.checkpoint(
                    block, x, use_reentrant=False, **self.checkpoint_options
                )  # (B, T, C)
            else:
                x = block(x)  # (B, T, C)
        x = self.transformer.ln_f(x)  # (B, T, C)
        return self.head(x, targets)

    def _residual_stream(self, x: torch.Tensor) -> torch.Tensor:
        """The residual stream's dtype: bf16 with ``residual_dtype="bf16"`` under bf16 autocast.

        Under autocast the blocks' matmuls return bf16, but fp32 + bf16 = fp32: the stream (and its
        gradient) would stay fp32. Cast once here and every residual add, LayerNorm read and
        residual gradient moves half the bytes; LayerNorm still computes in fp32 (autocast).
        Outside bf16 autocast (generation, fp32 evaluation, fp16 autocast) it stays fp32."""
        dev = x.device.type
        if (
            self.residual_bf16
            and torch.is_autocast_enabled(dev)
            and torch.get_autocast_dtype(dev) == torch.bfloat16
        ):
            return x.to(torch.bfloat16)
        return x

    def _lm_head(self, x: torch.Tensor, targets: torch.Tensor | None):
        """Logits (B, T, V_padded), then the loss with the chosen cross-entropy."""
        logits = self.lm_head(x)  # (B, T, V_padded)
        if targets is None:
            return logits, None
        loss = self.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        if self.detach_logits:
            # The training step only calls loss.backward(). A returned logits tensor that requires
            # grad makes torch.compile's backward graph take a (B, T, V) gradient for it, which
            # autograd fills with zeros and the graph adds to the loss's gradient: a memset and an
            # extra read of the model's largest tensor every step. Detached, they are values only.
            logits = logits.detach()
        return logits, loss

    def _fused_head(self, x: torch.Tensor, targets: torch.Tensor | None):
        """With targets: the LM head and the loss together, in chunks of rows, with the LM head's
        backward matmuls inside (:func:`helpers.core.kernels.linear_cross_entropy`); no logits."""
        if targets is None:
            return self.lm_head(x), None
        B, T, C = x.shape
        loss = self.linear_cross_entropy(
            x.view(B * T, C),
            self.lm_head.weight,
            targets.view(-1),
            fp8=self.lm_head_fp8,
        )
        return None, loss

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = 50,
        generator: torch.Generator | None = None,
        use_cache: bool = False,
    ) -> torch.Tensor:
        """Sample ``max_new_tokens`` tokens after ``idx`` (B, T0) int64; returns
        (B, T0 + max_new_tokens).

        Logits of padded ids (>= vocab_size) are set to -inf before sampling, so a padded model
        never returns an id the tokenizer cannot decode. ``top_k`` keeps the k most likely ids
        (None = all).

        ``use_cache=False`` recomputes the whole context for every new token (and crops it to the
        last block_size tokens). ``use_cache=True`` keeps every layer's keys and values in a KV
        cache and feeds only the new token (:func:`helpers.core.generation.generate_cached`,
        chapter 13): the same tokens (greedy, or sampled with the same ``generator``).

        Raises:
            ValueError: temperature <= 0; with ``use_cache``, T0 + max_new_tokens > block_size (a
                cache does not crop the context).
        """
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if use_cache:
            from helpers.core import generation  # imports this module: only when asked for

            return generation.generate_cached(
                self, idx, max_new_tokens, temperature, top_k, generator
            )
        was_training = self.training
        self.eval()
        V = self.config.vocab_size
        for _ in range(max_new_tokens):
            idx_cond = idx[:, -self.config.block_size :]  # crop to the context window
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :].float() / temperature  # (B, V_padded)
            logits[:, V:] = float("-inf")  # padded ids do not exist in the tokenizer
            if top_k is not None:
                k = min(top_k, V)
                v, _ = torch.topk(logits, k)
                logits[logits < v[:, [-1]]] = float("-inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
            idx = torch.cat((idx, idx_next), dim=1)
        self.train(was_training)
        return idx


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters (a tied weight counted once). GPT-2 124M: 124,439,808."""
    return sum(p.numel() for p in model.parameters())


def parameter_breakdown(model: GPT) -> dict[str, int]:
    """Parameters by part: embeddings (token, position), attention, MLP, LayerNorms. Sums to the
    total."""
    parts = {
        "token embedding (tied LM head)": 0,
        "position embedding": 0,
        "attention": 0,
        "mlp": 0,
        "layernorm": 0,
    }
    for name, p in model.named_parameters():
        if name.startswith("transformer.wte"):
            parts["token embedding (tied LM head)"] += p.numel()
        elif name.startswith("transformer.wpe"):
            parts["position embedding"] += p.numel()
        elif ".attn." in name:
            parts["attention"] += p.numel()
        elif ".mlp." in name:
            parts["mlp"] += p.numel()
        else:
            parts["layernorm"] += p.numel()
    return parts


def flops_per_token(config: GPTConfig, seq_len: int | None = None) -> int:
    """Training FLOPs per token (forward + backward) = 6N + 12·L·H·Q·T.

    N counts the non-embedding-position parameters of the *unpadded* model (token embedding /
    LM head included, position embedding excluded), so padding the vocab does not inflate MFU.
    L = n_layer, H = n_head, Q = head size, T = sequence length (block_size if None).
    Source: Chowdhery et al. 2022, "PaLM", Appendix B (https://arxiv.org/abs/2204.02311); the same
    estimate as nanoGPT's ``estimate_mfu``. GPT-2 124M at T=1024: 855,166,464 FLOPs per token.
    """
    T = config.block_size if seq_len is None else seq_len
    C, L = config.n_embd, config.n_layer
    per_block = 12 * C * C + 13 * C  # attn 4C^2+4C, mlp 8C^2+5C, two LayerNorms 4C
    n = config.vocab_size * C + L * per_block + 2 * C  # + final LayerNorm
    return 6 * n + 12 * L * config.n_head * config.head_size * T
