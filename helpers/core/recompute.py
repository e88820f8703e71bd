"""Selective activation checkpointing: which tensors a checkpointed block keeps (chapter 09).

Full checkpointing (``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)``) keeps
only the block's input and runs the whole block again in backward: every matmul twice. A
*selective* policy decides per operation: ``CheckpointPolicy.MUST_SAVE`` keeps its output for
backward, ``PREFER_RECOMPUTE`` drops it and recomputes it from the kept tensors. The policy here
keeps the outputs of the expensive operations (the matmuls and the attention kernel, whose
recomputation costs FLOPs) and recomputes the cheap elementwise ones (LayerNorm, GELU, residual
adds, dtype casts), which cost memory traffic but almost no FLOPs.

``GPT(checkpoint_policy="selective")`` applies it to the blocks ``checkpoint_every`` picks, through
PyTorch's own API (torch >= 2.4): ``checkpoint(block, x, use_reentrant=False,
context_fn=selective_context)``. PyTorch docs: https://pytorch.org/docs/stable/checkpoint.html
(``create_selective_checkpoint_contexts``).
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_aten = torch.ops.aten
# The operations whose outputs the selective policy keeps: matmuls (nn.Linear is addmm or mm at
# this level, batched ones bmm, the fp8 MLP's _scaled_mm) and every scaled-dot-product-attention
# kernel (its output and log-sum-exp; the manual attention path is made of bmm / softmax and keeps
# its bmm outputs).
SAVED_OPS: frozenset = frozenset(
    op
    for name in (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "_scaled_mm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    if hasattr(_aten, name)
    for op in [getattr(_aten, name).default]
)


def keep_matmuls_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """The selective policy: ``MUST_SAVE`` for an operation in :data:`SAVED_OPS`,
    ``PREFER_RECOMPUTE`` for any other. Called by PyTorch once per operation of a checkpointed
    region, in forward and again during the recomputation (``ctx.is_recompute``)."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


# The ``context_fn`` of torch.utils.checkpoint.checkpoint that applies the policy: a fresh pair of
# (forward, recompute) contexts per checkpointed call.
selective_context = functools.partial(create_selective_checkpoint_contexts, keep_matmuls_policy)
