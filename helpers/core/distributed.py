"""Data-parallel training on N processes: the process group, each rank's rows of the batch, DDP and
FSDP wrapping, the distributed step, and checkpoints.

``torchrun`` starts N copies and gives each one ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``;
:func:`init` reads them. On CUDA each process drives ``cuda:LOCAL_RANK`` and talks over NCCL; on a
CPU it uses gloo.

What each process does (data parallelism): it holds a full copy of the model, reads its own
``B`` rows of each global batch of ``B * WORLD_SIZE`` rows (:class:`ShardedBatchLoader`), and runs
forward and backward on them. ``DistributedDataParallel`` then averages the gradients over the
processes (an all-reduce), so every copy takes the same AdamW step and stays identical; the result
is the step a single process would take over the global batch. DDP groups gradients into buckets
(~25 MB) and starts each bucket's all-reduce as soon as backward has produced all its gradients,
so the communication overlaps with the rest of backward. During gradient accumulation only the
last micro-step needs the average: the others run under ``no_sync()`` (:func:`distributed_step`).

FSDP (``fully_shard``) keeps only 1/WORLD_SIZE of every parameter, gradient and AdamW moment on
each process and gathers a block's full weights just before it runs: the memory of the model
state falls by about WORLD_SIZE, paid for with more communication (:func:`state_bytes`; what it
sends per step: :mod:`helpers.core.collectives`).

Chapter 11's training runs, their command line and the scaling measurement use this module:
:mod:`helpers.chapters.ch11_multi_gpu`.

Sources: PyTorch DDP notes (https://pytorch.org/docs/stable/notes/ddp.html), Li et al. 2020,
"PyTorch Distributed: Experiences on Accelerating Data Parallel Training" (VLDB), the FSDP2 API
(https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html), torchrun
(https://pytorch.org/docs/stable/elastic/run.html).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from helpers.core import data, train

# --------------------------------------------------------------------------------------------
# Who am I: the process group
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job (from torchrun's environment variables)."""

    rank: int  # 0 .. world_size-1, unique over all nodes
    local_rank: int  # index of this process on its node: picks the GPU
    world_size: int  # number of processes (= GPUs) in the job
    device: torch.device  # cuda:LOCAL_RANK, or cpu
    backend: str | None  # "nccl" (CUDA), "gloo" (CPU), None when world_size == 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that logs and writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def env_from_environ(device: str | None = None, environ: dict | None = None) -> DistEnv:
    """The :class:`DistEnv` described by ``WORLD_SIZE``/``RANK``/``LOCAL_RANK`` (all default to a
    single process: 1/0/0). ``device``: "cuda", "cpu" or None (CUDA when available). Pure: it
    starts nothing.

    Raises:
        ValueError: CUDA asked for but not available, or LOCAL_RANK >= the number of visible GPUs.
    """
    environ = os.environ if environ is None else environ
    world_size = int(environ.get("WORLD_SIZE", 1))
    rank = int(environ.get("RANK", 0))
    local_rank = int(environ.get("LOCAL_RANK", 0))
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                "device 'cuda' asked for but no CUDA GPU is visible: use --device cpu (gloo)"
            )
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} GPU(s) are visible: "
                f"lower --nproc_per_node to at most {torch.cuda.device_count()}"
            )
        dev = torch.device("cuda", local_rank)
    elif kind == "cpu":
        dev = torch.device("cpu")
    else:
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    backend = None if world_size == 1 else ("nccl" if dev.type == "cuda" else "gloo")
    return DistEnv(rank, local_rank, world_size, dev, backend)


def init(device: str | None = None, group_of_one: bool = False) -> DistEnv:
    """Read torchrun's variables and, when WORLD_SIZE > 1, join the process group (NCCL on CUDA,
    gloo on a CPU). Call :func:`shutdown` at the end. A plain ``python -m`` run is world size 1.

    ``group_of_one``: join a process group even at WORLD_SIZE 1 (FSDP needs one; torchrun must
    have set MASTER_ADDR and MASTER_PORT). The returned env then names its backend."""
    env = env_from_environ(device)
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)
    if group_of_one and not env.distributed:
        env = dataclasses.replace(env, backend="nccl" if env.device.type == "cuda" else "gloo")
    if env.backend is not None and not dist.is_initialized():
        dist.init_process_group(backend=env.backend)
    return env


def shutdown(env: DistEnv) -> None:
    """Leave the process group (no-op when there is none)."""
    if env.backend is not None and dist.is_initialized():
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    """Wait until every process got here (no-op for a single process)."""
    if env.distributed:
        if env.backend == "nccl":
            dist.barrier(device_ids=[env.local_rank])
        else:
            dist.barrier()


# --------------------------------------------------------------------------------------------
# Each rank reads its own rows
# --------------------------------------------------------------------------------------------


def shard_rows(n_rows: int, world_size: int, rank: int) -> slice:
    """Rows of a global batch of ``n_rows`` that ``rank`` trains on: the rank-th contiguous block
    of ``n_rows // world_size`` rows. Disjoint over ranks, and their union is every row.

    Raises:
        ValueError: ``n_rows`` not divisible by ``world_size`` (ranks would get unequal work and
            the gradient average would weight rows unequally), or rank outside [0, world_size).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if n_rows % world_size:
        raise ValueError(f"{n_rows} rows cannot be split evenly over {world_size} ranks")
    per_rank = n_rows // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


class ShardedBatchLoader:
    """This rank's (x, y) rows of each global batch of ``batch_size * world_size`` rows.

    Every rank reads the same global batch from the token stream (the same positions as a single
    :class:`helpers.core.data.BatchLoader` with B = batch_size * world_size) and keeps its
    :func:`shard_rows` block: (B, T) int64 on ``env.device``. Over the ranks the rows are exactly
    the single-process global batch, which is what makes DDP's result equal a single-process step.
    """

    def __init__(self, tokens: torch.Tensor, batch_size: int, seq_len: int, env: DistEnv):
        self.env = env
        self.B, self.T = batch_size, seq_len
        self.global_loader = data.BatchLoader(tokens, batch_size * env.world_size, seq_len, "cpu")
        self.rows = shard_rows(batch_size * env.world_size, env.world_size, env.rank)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.global_loader.next_batch()  # (B * world_size, T) on the CPU
        x, y = x[self.rows], y[self.rows]  # (B, T): this rank's rows
        if self.env.device.type == "cuda":
            return x.pin_memory().to(self.env.device, non_blocking=True), y.pin_memory().to(
                self.env.device, non_blocking=True
            )
        return x, y


# --------------------------------------------------------------------------------------------
# Wrapping the model: DDP or FSDP
# --------------------------------------------------------------------------------------------


@dataclass
class AllReduceCounter:
    """How many bucket all-reduces DDP launched, and their bytes
    (see :func:`counting_allreduce_hook`)."""

    calls: int = 0
    bytes: int = 0


def counting_allreduce_hook(state: AllReduceCounter, bucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: count the bucket, then do what DDP does by default (average the
    bucket's gradients over the ranks with one all-reduce)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    buffer = bucket.buffer()
    state.calls += 1
    state.bytes += buffer.numel() * buffer.element_size()
    return default_hooks.allreduce_hook(None, bucket)


# DDP compares the hook's annotation with the real type, not with the string this module's
# `from __future__ import annotations` leaves there.
counting_allreduce_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]


def wrap_ddp(
    trainer: train.Trainer,
    env: DistEnv,
    bucket_cap_mb: float = 25.0,
    count_allreduces: bool = False,
) -> tuple[torch.nn.Module, AllReduceCounter | None]:
    """Wrap ``trainer.model`` in DistributedDataParallel and make it the trainer's forward.

    DDP shares the model's parameters (it broadcasts rank 0's values once, at construction), so
    ``trainer.model.parameters()`` and ``trainer.optimizer`` stay the ones the step clips and steps.
    Returns (the DDP module, the all-reduce counter or None).

    Raises:
        ValueError: no process group (world size 1 without :func:`init`'s ``group_of_one``:
            nothing to average), or a compiled run (not wired in chapter 11).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not dist.is_initialized():
        raise ValueError("DDP needs WORLD_SIZE > 1: launch with torchrun --nproc_per_node=N")
    if trainer.run.compile is not None:
        raise ValueError("torch.compile + DDP is not wired in this chapter: use compile=None")
    ddp = DDP(
        trainer.model,
        device_ids=[env.local_rank] if env.device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
    )
    counter = None
    if count_allreduces:
        counter = AllReduceCounter()
        ddp.register_comm_hook(counter, counting_allreduce_hook)
    trainer.forward = ddp
    return ddp, counter


def fully_shard_api():
    """``fully_shard`` from ``torch.distributed.fsdp`` (torch >= 2.6), else from the older
    ``torch.distributed._composable.fsdp``.

    Raises:
        ImportError: this torch has neither (FSDP2 needs torch >= 2.4).
    """
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def _mixed_precision_policy(param_dtype: torch.dtype | None, reduce_dtype: torch.dtype | None):
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def fsdp_units(model: torch.nn.Module) -> list[tuple[str, list[torch.Tensor]]]:
    """The FSDP units :func:`wrap_fsdp` makes, in the order it makes them: ("h.0", its
    parameters), ..., then ("root", the parameters of no block: embeddings, final LayerNorm;
    the tied lm_head weight once). Works on a sharded or an unsharded model."""
    in_blocks = set()
    units = []
    for i, block in enumerate(model.transformer.h):
        params = list(block.parameters())
        in_blocks.update(id(p) for p in params)
        units.append((f"h.{i}", params))
    units.append(("root", [p for p in model.parameters() if id(p) not in in_blocks]))
    return units


def fsdp_reshard_choices(n_units: int, reshard_after_forward: bool | None) -> list[bool]:
    """Whether each of :func:`fsdp_units`' ``n_units`` units frees its gathered parameters after
    forward. None: the blocks do and the root does not (``fully_shard``'s default: backward
    starts with the root's lm_head, so it would gather them again at once); a bool: every unit."""
    if reshard_after_forward is None:
        return [True] * (n_units - 1) + [False]
    return [bool(reshard_after_forward)] * n_units


def fsdp_unsupported_reason(device: torch.device) -> str | None:
    """Why FSDP2 cannot run on ``device`` with this torch (None if it can, as far as the course has
    seen).

    torch 2.4.1's ``fully_shard`` creates CUDA streams even for a CPU mesh and fails on a machine
    without a GPU ("CUDA driver version is insufficient", seen 2026-11-29); torch 2.13 runs it with
    gloo on a CPU. Versions in between are untested, so only torch < 2.5 on a CPU is refused.
    """
    version = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    if torch.device(device).type == "cpu" and version < (2, 5):
        return (
            f"FSDP2 on a CPU needs a newer torch than {torch.__version__} "
            "(its fully_shard needs CUDA here): "
            "run the FSDP part on a GPU, or upgrade torch"
        )
    return None


def wrap_fsdp(
    trainer: train.Trainer,
    env: DistEnv,
    reshard_after_forward: bool | None = None,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
) -> torch.nn.Module:
    """Shard ``trainer.model`` over all ranks with FSDP2: each transformer block is one unit
    (its full weights are gathered just before it runs), the rest (embeddings, final LayerNorm)
    is the root unit (:func:`fsdp_units`). The parameters become DTensors holding 1/world_size of
    the rows, so a new AdamW is made over them (its moments are sharded too). Returns the sharded
    model, which is also the trainer's model and forward.

    ``reshard_after_forward``: see :func:`fsdp_reshard_choices` (None: blocks free their gathered
    weights after forward, the root keeps them). ``param_dtype``: the dtype FSDP gathers and
    computes the parameters in (``MixedPrecisionPolicy``; None: fp32, as stored);
    ``reduce_dtype``: the gradients' dtype in the reduce-scatter (None: ``param_dtype``).

    Raises:
        ValueError: no process group (world size 1 without :func:`init`'s ``group_of_one``),
            or a compiled run.
        RuntimeError: FSDP2 cannot run on this device with this torch
            (:func:`fsdp_unsupported_reason`).
    """
    if not dist.is_initialized():
        raise ValueError("FSDP needs WORLD_SIZE > 1: launch with torchrun --nproc_per_node=N")
    if trainer.run.compile is not None:
        raise ValueError("torch.compile + FSDP is not wired in this chapter: use compile=None")
    reason = fsdp_unsupported_reason(env.device)
    if reason is not None:
        raise RuntimeError(reason)
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard = fully_shard_api()
    mesh = init_device_mesh(env.device.type, (env.world_size,))
    mp = _mixed_precision_policy(param_dtype, reduce_dtype)
    n_blocks = len(trainer.model.transformer.h)
    reshard = fsdp_reshard_choices(n_blocks + 1, reshard_after_forward)
    for block, free in zip(trainer.model.transformer.h, reshard, strict=False):
        fully_shard(block, mesh=mesh, reshard_after_forward=free, mp_policy=mp)
    fully_shard(trainer.model, mesh=mesh, reshard_after_forward=reshard[-1], mp_policy=mp)
    trainer.forward = trainer.model
    trainer.optimizer = train.make_optimizer(trainer.model, trainer.run)
    return trainer.model


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor's shard on this rank


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of model state held by THIS rank: {"params", "grads", "optimizer", "total"}.

    Counts the local shard of sharded (FSDP) tensors, the whole tensor otherwise; grads that are
    None count 0; optimizer state counts AdamW's tensors (exp_avg, exp_avg_sq; the 0-d step too).
    """
    params = list(model.parameters())

    def nbytes(ts) -> int:
        return sum(_local(t).numel() * t.element_size() for t in ts if t is not None)

    opt = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    out = {
        "params": nbytes(params),
        "grads": nbytes(p.grad for p in params),
        "optimizer": nbytes(opt),
    }
    out["total"] = sum(out.values())
    return out


# --------------------------------------------------------------------------------------------
# The distributed step (mirrors train.Trainer.step)
# --------------------------------------------------------------------------------------------


def _sync_context(forward: torch.nn.Module, sync: bool):
    """No gradient communication on this micro-step when ``sync`` is False: ``no_sync()`` for
    DDP, ``set_requires_gradient_sync(False)`` for FSDP; a no-op for a plain module."""
    if sync:
        if hasattr(forward, "set_requires_gradient_sync"):
            forward.set_requires_gradient_sync(True)
        return contextlib.nullcontext()
    if hasattr(forward, "no_sync"):
        return forward.no_sync()
    if hasattr(forward, "set_requires_gradient_sync"):
        forward.set_requires_gradient_sync(False)
    return contextlib.nullcontext()


def distributed_step(
    trainer: train.Trainer, batches, sync_every_micro_step: bool = False
) -> torch.Tensor:
    """One optimizer step of ``trainer`` with its forward wrapped by DDP or FSDP (or not at all).

    The same work as :meth:`helpers.core.train.Trainer.step`, in the same order: zero_grad ->
    for each of ``grad_accum_steps`` micro-batches: autocast forward + loss / grad_accum_steps,
    backward (scaled for fp16) -> unscale -> clip (``Trainer.clip``) -> optimizer step
    (``Trainer.optimizer_step``). The gradients are averaged over the ranks only during the LAST
    micro-step's backward (``no_sync`` before it), unless ``sync_every_micro_step`` (an ablation:
    same result, more communication).

    ``batches``: anything with ``next_batch()`` giving this rank's (x, y), (B, T) int64 on the
    device. Returns this rank's mean micro-batch loss, a detached 0-d fp32 tensor (no host sync).
    """
    run = trainer.run
    torch.set_float32_matmul_precision("highest" if run.matmul_precision == "fp32" else "high")
    trainer.optimizer.zero_grad(set_to_none=True)
    total = None
    for i in range(run.grad_accum_steps):
        x, y = batches.next_batch()
        last = i == run.grad_accum_steps - 1
        with _sync_context(trainer.forward, sync=last or sync_every_micro_step):
            with trainer.autocast():
                _, loss = trainer.forward(x, y)
            loss = loss / run.grad_accum_steps  # mean over micro-steps, not a sum
            if trainer.scaler is not None:
                trainer.scaler.scale(loss).backward()
            else:
                loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    # unscale (fp16), clip_grad_norm_ or the fused clip's divisor: Trainer.step's own code
    trainer.clip()
    trainer.optimizer_step()
    return total


# --------------------------------------------------------------------------------------------
# Checkpoints: gathered everywhere, written by rank 0
# --------------------------------------------------------------------------------------------


def full_state(trainer: train.Trainer) -> dict:
    """{"model": full state_dict, "optimizer": full optimizer state_dict}, on the CPU, with the
    same keys as an unwrapped model's. A collective for FSDP (every rank must call it); for DDP
    and a single process it is a local copy."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer, options=opts)
    return {"model": model_sd, "optimizer": optim_sd}


def is_checkpoint(path: str | Path) -> bool:
    """Is ``path`` a file ``torch.save`` wrote: a zip archive holding ``<name>/data.pkl`` (its
    format since torch 1.6), not any zip (a .docx is one)? The ``same_kind`` test of the
    ``--checkpoint`` option (:func:`helpers.tools.cli.out_path`)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("/data.pkl") for n in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def save_checkpoint(path: str | Path, trainer: train.Trainer, env: DistEnv, step: int) -> None:
    """Write model + optimizer state to ``path`` from rank 0 only, then wait at a barrier, so no
    rank reads (or the job exits before) the file is complete. Every rank must call it."""
    state = full_state(trainer)
    if env.is_main:
        state.update(step=step, run=dataclasses.asdict(trainer.run), world_size=env.world_size)
        torch.save(state, path)
    barrier(env)


# --------------------------------------------------------------------------------------------
# Comparing two runs
# --------------------------------------------------------------------------------------------


def max_param_diff(checkpoint_a: str | Path, checkpoint_b: str | Path) -> float:
    """Largest |a - b| over every parameter of two checkpoints written by :func:`save_checkpoint`.

    Raises:
        ValueError: the checkpoints hold different parameter names or shapes.
    """
    a = torch.load(checkpoint_a, map_location="cpu")["model"]
    b = torch.load(checkpoint_b, map_location="cpu")["model"]
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        raise ValueError("the two checkpoints hold different parameters")
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)
