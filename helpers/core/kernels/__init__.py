"""Hand-written Triton kernels for the LM head, its cross-entropy, the MLP, the attention's QKV
gradient and AdamW: six rungs.

One file per mechanism, each explained at its top:

- ``triton_ce.py``, rung "+ Triton CE": :func:`cross_entropy`, the loss alone in two kernels (the
  logits read once forward, once backward), and the row passes the fused kernels reuse.
- ``fused_ce.py``, rung "+ fused LM-head CE": :func:`linear_cross_entropy`, the LM head and the loss
  in chunks of rows with the gradients made in the forward; its ``fp8=True`` path and the kernel
  that writes an e5m2 gradient serve rung "+ fp8 LM head".
- ``fp8.py``, rungs "+ fp8 LM head" and "+ fp8 MLP": the fp8 formats and their scales (tensorwise
  :func:`to_fp8_e4m3`, rowwise :func:`rowwise_e4m3`), the scaled matmul (:func:`scaled_mm`), the
  tiled transpose (:func:`transpose_fp8`) and whether fp8 matmuls run here (:func:`fp8_available`).
- ``fp8_mlp.py``, rung "+ fp8 MLP": :func:`mlp_fp8`, the MLP's forward and input-gradient matmuls
  in fp8 with the GELU and its casts in two one-pass kernels.
- ``qkv_grad.py``, rung "+ one-pass QKV grad": :func:`qkv_grad.qkv_grad_cat`, dq, dk, dv
  concatenated into ``c_attn``'s gradient and summed for its bias gradient in one read.
- ``adamw.py``, rung "+ Triton AdamW" (``RunConfig(optimizer="triton")``):
  :class:`adamw.TritonAdamW`, AdamW in one launch per parameter group.
- ``_triton.py``: the Triton import (``triton`` is None without the package), :func:`available`,
  :data:`TRITON_OP_MISSING` and the launch that ``torch.compile`` traces.

The kernels run on CUDA GPUs, and on CPU tensors in Triton's interpreter when ``TRITON_INTERPRET=1``
is set before this package is imported (tests). Their tunables (block sizes, warps, rows per chunk)
live in the module that reads them: ``fused_ce.FUSED_CHUNK_ROWS``, ``triton_ce.NUM_WARPS``.
"""

from helpers.core.kernels._triton import TRITON_OP_MISSING, available, triton
from helpers.core.kernels.fp8 import (
    fp8_available,
    rowwise_e4m3,
    scaled_mm,
    to_fp8_e4m3,
    transpose_fp8,
)
from helpers.core.kernels.fp8_mlp import mlp_fp8
from helpers.core.kernels.fused_ce import linear_cross_entropy
from helpers.core.kernels.triton_ce import IGNORE_INDEX, cross_entropy

__all__ = [
    "IGNORE_INDEX",
    "TRITON_OP_MISSING",
    "available",
    "cross_entropy",
    "fp8_available",
    "mlp_fp8",
    "linear_cross_entropy",
    "rowwise_e4m3",
    "scaled_mm",
    "to_fp8_e4m3",
    "transpose_fp8",
    "triton",
]
