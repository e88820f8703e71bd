"""The collectives a training step issues, recorded, and the arithmetic FSDP's should match.

FSDP2 (``fully_shard``) keeps 1/W of every parameter on each of W ranks. Per optimizer step
(one micro-step, no gradient accumulation) each FSDP unit

- **all-gathers** its parameters once before its forward, and once more before its backward if
  it freed them after forward (``reshard_after_forward=True``): the gathered buffer holds the
  unit's parameters in the compute dtype (``MixedPrecisionPolicy.param_dtype``, else fp32);
- **reduce-scatters** its gradients once, after its backward: the buffer holds the unit's
  gradients in ``reduce_dtype`` (default: the compute dtype), and each rank keeps the sum of its
  1/W rows.

Every tensor is split on its first dimension, padded up to a multiple of W rows, so a buffer
holds ``ceil(rows / W) * W * (numel / rows)`` elements per tensor (:func:`padded_numel`).

:class:`CollectiveRecorder` sees every ``c10d`` and ``_c10d_functional`` operator the code under
it dispatches (FSDP's all-gathers and reduce-scatters, DDP's bucket all-reduces, DTensor's
all-reduce of the gradient norm in ``clip_grad_norm_``) and records its kind and the bytes of the
full, unsharded buffer. With a ring algorithm each rank sends and receives (W-1)/W of that.

Sources: FSDP2 API and its ``MixedPrecisionPolicy``
(https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html); Zhao et al. 2023, "PyTorch
FSDP: Experiences on Scaling Fully Sharded Data Parallel" (VLDB), section 3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# operator name (without namespace) -> kind; "bytes of" picks the buffer counted
_KINDS = {
    "_allgather_base_": ("all_gather", "out"),
    "allgather_": ("all_gather", "out"),
    "allgather_into_tensor_coalesced_": ("all_gather", "out"),
    "all_gather_into_tensor": ("all_gather", "in_x_world"),
    "all_gather_into_tensor_coalesced": ("all_gather", "in_x_world"),
    "_reduce_scatter_base_": ("reduce_scatter", "in"),
    "reduce_scatter_": ("reduce_scatter", "in"),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", "in"),
    "reduce_scatter_tensor": ("reduce_scatter", "first"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", "first"),
    "allreduce_": ("all_reduce", "first"),
    "allreduce_coalesced_": ("all_reduce", "first"),
    "all_reduce": ("all_reduce", "first"),
    "all_reduce_coalesced": ("all_reduce", "first"),
    "broadcast_": ("broadcast", "first"),
    "broadcast": ("broadcast", "first"),
}
_NOT_COLLECTIVES = ("wait", "_wrap")  # waiting on a collective, wrapping its output tensor
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "other")


def _dtensor_type() -> type:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import DTensor
    return DTensor


def _tensors(x) -> list[torch.Tensor]:
    if torch.is_tensor(x):
        return [x]
    if isinstance(x, list | tuple):
        return [t for item in x for t in _tensors(item)]
    return []


def _nbytes(x) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(x))


@dataclass
class Collective:
    """One collective call: its kind (one of :data:`KINDS`), the operator, the bytes of the full
    (unsharded) buffer and its dtype."""

    kind: str
    op: str
    bytes: int
    dtype: str


class CollectiveRecorder(TorchDispatchMode):
    """``with CollectiveRecorder() as rec: step()`` records every collective the step issues, in
    order, in ``rec.calls`` (a list of :class:`Collective`), including those DTensor issues
    inside an operator. Waits are not counted. Slows the step down (every operator passes through
    Python): time steps outside it."""

    def __init__(self):
        super().__init__()
        self.calls: list[Collective] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **(kwargs or {}))
        if any(issubclass(t, _dtensor_type()) for t in types):
            # a mode runs before tensor subclasses: NotImplemented lets DTensor turn the op into
            # plain ops and collectives first (DTensor's all-reduce of a sharded gradient norm),
            # which then come back here (as torch.distributed.tensor.debug.CommDebugMode does)
            return NotImplemented
        namespace, _, name = func._schema.name.partition("::")
        if namespace in ("c10d", "_c10d_functional") and not name.startswith(_NOT_COLLECTIVES):
            kind, which = _KINDS.get(name, ("other", "first"))
            buf = args[1] if which == "in" else args[0]
            n = _nbytes(buf)
            if which == "in_x_world":  # functional all-gather: (input, group_size, group)
                n *= int(args[1])
            ts = _tensors(buf)
            self.calls.append(Collective(kind, name, n, str(ts[0].dtype) if ts else "-"))
        return func(*args, **(kwargs or {}))

    def summary(self) -> dict[str, dict]:
        """{kind: {"count": calls, "bytes": total bytes, "dtypes": sorted dtypes}} for the kinds
        seen (JSON-ready)."""
        out: dict[str, dict] = {}
        for c in self.calls:
            s = out.setdefault(c.kind, {"count": 0, "bytes": 0, "dtypes": []})
            s["count"] += 1
            s["bytes"] += c.bytes
            if c.dtype not in s["dtypes"]:
                s["dtypes"] = sorted([*s["dtypes"], c.dtype])
        return out


def padded_numel(shape: Sequence[int], world_size: int) -> int:
    """Elements of a tensor of ``shape`` in FSDP2's buffers: its first dimension padded up to a
    multiple of ``world_size`` (so each rank's shard has equal rows).

    Raises:
        ValueError: ``world_size`` < 1.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if len(shape) == 0:
        return 1
    rows = math.ceil(shape[0] / world_size) * world_size
    return rows * math.prod(shape[1:])


def expected_fsdp_traffic(
    unit_shapes: Sequence[Sequence[Sequence[int]]],
    reshard_after_forward: Sequence[bool],
    world_size: int,
    param_dtype: torch.dtype = torch.float32,
    reduce_dtype: torch.dtype | None = None,
) -> dict[str, dict[str, int]]:
    """What FSDP2 must all-gather and reduce-scatter in one optimizer step (one micro-step).

    ``unit_shapes[u]``: the parameter shapes of FSDP unit u; ``reshard_after_forward[u]``: whether
    unit u frees its gathered parameters after forward (then it gathers them again in backward).
    ``param_dtype``: the dtype the parameters are gathered and computed in; ``reduce_dtype``: the
    gradients' dtype in the reduce-scatter (None: ``param_dtype``, as FSDP2's default).

    Returns {"all_gather": {"count", "bytes"}, "reduce_scatter": {"count", "bytes"}}, bytes of the
    full padded buffers (:func:`padded_numel`):
    all-gather = sum over units of padded params x param bytes x (1 + reshard_after_forward[u]);
    reduce-scatter = sum over units of padded params x reduce bytes, one call per unit.

    Raises:
        ValueError: ``unit_shapes`` and ``reshard_after_forward`` differ in length.
    """
    if len(unit_shapes) != len(reshard_after_forward):
        raise ValueError(
            f"{len(unit_shapes)} units but {len(reshard_after_forward)} reshard_after_forward"
        )
    reduce_dtype = reduce_dtype or param_dtype
    p_bytes = torch.empty((), dtype=param_dtype).element_size()
    r_bytes = torch.empty((), dtype=reduce_dtype).element_size()
    ag = {"count": 0, "bytes": 0}
    rs = {"count": 0, "bytes": 0}
    for shapes, reshard in zip(unit_shapes, reshard_after_forward, strict=True):
        numel = sum(padded_numel(s, world_size) for s in shapes)
        passes = 2 if reshard else 1
        ag["count"] += passes
        ag["bytes"] += passes * numel * p_bytes
        rs["count"] += 1
        rs["bytes"] += numel * r_bytes
    return {"all_gather": ag, "reduce_scatter": rs}


def matches(recorded: dict[str, dict], expected: dict[str, dict[str, int]]) -> bool:
    """True when ``recorded`` (:meth:`CollectiveRecorder.summary`) holds, for every kind in
    ``expected`` (:func:`expected_fsdp_traffic`), exactly its count and bytes."""
    return all(
        {k: recorded.get(kind, {}).get(k) for k in ("count", "bytes")} == want
        for kind, want in expected.items()
    )
