"""Graded checks of chapter 11 (more than one GPU): sharding a batch over ranks, and what an
all-reduce that averages gradients leaves on every rank. Pure CPU, no process group needed.

Listed in :mod:`helpers.grading` (``grading.check_shard_batches`` ...); the right
answers live in ``tests/answers_ch11.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from helpers.grading.common import passed, reread

SECTIONS = {
    "ch11_shard_batches": "chapter 11, section 2 (Each rank reads its own rows)",
    "ch11_allreduce_mean": "chapter 11, section 3 (Averaging the gradients: all-reduce)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


SHARD_CASES = [(8, 2), (12, 4), (6, 3), (5, 1)]  # (rows of the global batch N, world size W)


def _global_batch(n_rows: int, seq_len: int = 3) -> torch.Tensor:
    return torch.arange(n_rows * seq_len).view(n_rows, seq_len)  # row i holds i*T .. i*T+T-1


def check_shard_batches(fn: Callable[[torch.Tensor, int, int], torch.Tensor]) -> None:
    """Check ``shard_batch(x, world_size, rank) -> Tensor``: rank ``rank``'s rows of the global
    batch ``x`` of shape (N, T): the rank-th contiguous block ``x[rank*N/W : (rank+1)*N/W]``.

    For each (N, W) the shards of all ranks must have N/W rows each, never share a row, together
    hold every row, and keep the rows in order (what
    :class:`helpers.core.distributed.ShardedBatchLoader` does, so the ranks together train on
    exactly the single-process batch).

    Raises:
        AssertionError: a one-line hint naming the first property that fails.
    """
    gid = "ch11_shard_batches"
    for n_rows, world in SHARD_CASES:
        x = _global_batch(n_rows)
        per_rank = n_rows // world
        shards = []
        for rank in range(world):
            call = f"shard_batch(x of shape {tuple(x.shape)}, world_size={world}, rank={rank})"
            got = fn(x.clone(), world, rank)
            if not isinstance(got, torch.Tensor):
                raise AssertionError(
                    f"{call} returned {type(got).__name__}, expected a tensor of rows of x. "
                    f"{_reread(gid)}"
                )
            if got.dim() != 2 or got.shape[1] != x.shape[1]:
                raise AssertionError(
                    f"{call} returned shape {tuple(got.shape)}, "
                    f"expected ({per_rank}, {x.shape[1]}): whole rows of x. {_reread(gid)}"
                )
            if world > 1 and got.shape[0] == n_rows:
                raise AssertionError(
                    f"{call} returned all {n_rows} rows: every rank trains on the full batch, "
                    f"so the {world} ranks do the same work {world} times. {_reread(gid)}"
                )
            shards.append(got)
        rows = [
            [int(r[0]) // x.shape[1] for r in s] for s in shards
        ]  # row index of each returned row
        sizes = [len(r) for r in rows]
        flat = [i for r in rows for i in r]
        where = f"N={n_rows}, world_size={world}"
        if len(set(flat)) < len(flat):
            why = (
                f"{where}: the shards overlap (rank sizes {sizes}): "
                "a row trained on by two ranks counts twice in the average."
            )
        elif set(flat) != set(range(n_rows)):
            missing = sorted(set(range(n_rows)) - set(flat))
            why = (
                f"{where}: rows {missing} are on no rank (rank sizes {sizes}): "
                "an off-by-one start or stride skips rows."
            )
        elif len(set(sizes)) != 1:
            why = f"{where}: unequal shards {sizes}: every rank must get N/world_size rows."
        elif rows != [list(range(r * per_rank, (r + 1) * per_rank)) for r in range(world)]:
            why = (
                f"{where}: rank 0 got rows {rows[0]}, expected the first contiguous block "
                f"{list(range(per_rank))} (rank r gets rows r*N/W .. (r+1)*N/W - 1, in order)."
            )
        else:
            continue
        raise AssertionError(f"{why} {_reread(gid)}")
    passed(
        gid,
        f"{len(SHARD_CASES)} (N, world_size) cases: equal, disjoint, "
        "in-order shards whose union is the global batch",
    )


ALLREDUCE_CASES = [(2, (3, 4)), (3, (5,)), (4, (2, 3, 2))]  # (world size, gradient shape)


def check_allreduce_mean(fn: Callable[[list[torch.Tensor]], list[torch.Tensor]]) -> None:
    """Check ``allreduce_mean(grads) -> list``: ``grads[r]`` is rank r's gradient of one
    parameter; return what each rank holds after an all-reduce (sum over ranks) divided by the
    world size: a list of world_size tensors, each the mean of all ``grads``.

    Raises:
        AssertionError: a one-line hint (sum without divide, divided twice, rank 0 only, ...).
    """
    gid = "ch11_allreduce_mean"
    gen = torch.Generator().manual_seed(11)
    for world, shape in ALLREDUCE_CASES:
        grads = [torch.randn(shape, generator=gen) for _ in range(world)]
        call = f"allreduce_mean(grads of {world} ranks, each of shape {shape})"
        got = fn([g.clone() for g in grads])
        if not isinstance(got, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in got):
            raise AssertionError(
                f"{call} returned {type(got).__name__}, expected a list of {world} tensors "
                f"(one per rank). {_reread(gid)}"
            )
        if len(got) != world:
            raise AssertionError(
                f"{call} returned {len(got)} tensors, expected {world}: "
                f"one per rank, every rank holds the result. {_reread(gid)}"
            )
        if any(t.shape != torch.Size(shape) for t in got):
            raise AssertionError(
                f"{call} returned shapes {[tuple(t.shape) for t in got]}, "
                f"expected {shape} on every rank. {_reread(gid)}"
            )
        total = torch.stack(grads).sum(0)
        mean = total / world
        close = lambda a, b: torch.allclose(a.float(), b, rtol=1e-5, atol=1e-6)  # noqa: E731
        if all(close(t, mean) for t in got):
            continue
        if all(close(t, total) for t in got):
            why = (
                f"{call}: every rank holds the SUM of the gradients: "
                f"divide by the world size ({world}) to get the mean."
            )
        elif all(close(t, mean / world) for t in got):
            why = (
                f"{call}: every rank holds the mean divided by {world} again: "
                "divide the sum by the world size once."
            )
        elif (
            all(close(t, grads[0]) for t in got)
            or close(got[0], mean)
            and not all(close(t, mean) for t in got[1:])
        ):
            why = (
                f"{call}: only rank 0's result is right (or every rank got rank 0's gradient): "
                "after an all-reduce every rank holds the same mean."
            )
        elif all(close(t, g) for t, g in zip(got, grads, strict=True)):
            why = f"{call}: every rank kept its own gradient: nothing was reduced."
        else:
            why = (
                f"{call}: rank 0 holds {got[0].flatten()[:3].tolist()}..., "
                f"expected the mean {mean.flatten()[:3].tolist()}..."
            )
        raise AssertionError(f"{why} {_reread(gid)}")
    passed(
        gid,
        f"{len(ALLREDUCE_CASES)} world sizes: every rank holds the mean of all ranks' gradients",
    )


# ---- plausible wrong answers (tests/test_grading.py proves each one is rejected) --------------


def _shard_full_batch(x: torch.Tensor, world_size: int, rank: int) -> torch.Tensor:
    return x


def _shard_overlapping(x: torch.Tensor, world_size: int, rank: int) -> torch.Tensor:
    b = x.shape[0] // world_size
    return x[rank * b : (rank + 1) * b + 1]


def _shard_off_by_one(x: torch.Tensor, world_size: int, rank: int) -> torch.Tensor:
    b = x.shape[0] // world_size
    return x[rank * b + 1 : (rank + 1) * b + 1]


def _shard_strided_off_by_one(x: torch.Tensor, world_size: int, rank: int) -> torch.Tensor:
    return x[rank + 1 :: world_size + 1]


def _shard_strided(x: torch.Tensor, world_size: int, rank: int) -> torch.Tensor:
    return x[rank::world_size]


def _allreduce_sum(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    total = torch.stack(grads).sum(0)
    return [total.clone() for _ in grads]


def _allreduce_divide_twice(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    world = len(grads)
    total = torch.stack([g / world for g in grads]).sum(0) / world
    return [total.clone() for _ in grads]


def _allreduce_rank0_only(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    mean = torch.stack(grads).mean(0)
    return [mean] + [g for g in grads[1:]]


def _allreduce_broadcast_rank0(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    return [grads[0].clone() for _ in grads]


CHECKS: dict[str, Callable[..., Any]] = {
    "ch11_shard_batches": check_shard_batches,
    "ch11_allreduce_mean": check_allreduce_mean,
}

WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch11_shard_batches": [
        _shard_full_batch,
        _shard_overlapping,
        _shard_off_by_one,
        _shard_strided_off_by_one,
        _shard_strided,
    ],
    "ch11_allreduce_mean": [
        _allreduce_sum,
        _allreduce_divide_twice,
        _allreduce_rank0_only,
        _allreduce_broadcast_rank0,
    ],
}
