"""Right answers of chapter 11's exercises (loaded by tests/test_grading.py)."""

import torch


def shard_batch(x: torch.Tensor, world_size: int, rank: int) -> torch.Tensor:
    per_rank = x.shape[0] // world_size
    return x[rank * per_rank : (rank + 1) * per_rank]


def allreduce_mean(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    total = torch.stack(grads).sum(dim=0)
    return [total / len(grads) for _ in grads]


RIGHT_ANSWERS = {
    "ch11_shard_batches": shard_batch,
    "ch11_allreduce_mean": allreduce_mean,
}
