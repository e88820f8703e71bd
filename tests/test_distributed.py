"""Tests for helpers/core/distributed.py without a process group: torchrun's variables, each
rank's rows, the distributed step on one process, the state bytes, and what DDP and FSDP refuse.
Real 2-process runs: tests/test_ch11_multi_gpu.py.
"""

import pytest
import torch

from helpers.core import data, distributed, train


def _env(rank: int, world: int) -> distributed.DistEnv:
    return distributed.DistEnv(
        rank, rank, world, torch.device("cpu"), "gloo" if world > 1 else None
    )


def test_env_reads_torchrun_variables_and_picks_gloo_on_cpu():
    env = distributed.env_from_environ("cpu", {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    assert (env.rank, env.local_rank, env.world_size, env.backend) == (1, 1, 2, "gloo")
    assert not env.is_main and env.distributed
    single = distributed.env_from_environ("cpu", {})
    assert (single.world_size, single.rank, single.backend, single.is_main) == (1, 0, None, True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_env_asking_for_cuda_without_a_gpu_says_so():
    with pytest.raises(ValueError, match="--device cpu"):
        distributed.env_from_environ("cuda", {})


def test_shard_rows_are_equal_disjoint_and_cover_the_batch():
    slices = [distributed.shard_rows(12, 4, r) for r in range(4)]
    rows = [list(range(12))[s] for s in slices]
    assert rows == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    with pytest.raises(ValueError, match="evenly"):
        distributed.shard_rows(10, 4, 0)
    with pytest.raises(ValueError, match="rank"):
        distributed.shard_rows(8, 2, 2)


def test_sharded_loader_ranks_together_read_the_single_process_batch():
    tokens = torch.arange(1000)
    B, T, world = 2, 16, 3
    loaders = [distributed.ShardedBatchLoader(tokens, B, T, _env(r, world)) for r in range(world)]
    single = data.BatchLoader(tokens, B * world, T)
    for _ in range(12):  # 12 draws of 97 tokens wrap around the 1000-token stream
        parts = [loader.next_batch() for loader in loaders]
        x, y = single.next_batch()
        assert all(p[0].shape == (B, T) for p in parts)
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)


def _tiny_trainer(tiny_config, accum: int) -> train.Trainer:
    run = train.RunConfig(batch_size=2, seq_len=16, grad_accum_steps=accum, lr=1e-3)
    return train.build(run, tiny_config, "cpu")


def test_distributed_step_on_one_process_is_exactly_trainer_step(tiny_config):
    tokens = data.load_tokens()[:20_000]
    a, b = _tiny_trainer(tiny_config, 2), _tiny_trainer(tiny_config, 2)
    la, lb = (
        data.BatchLoader(tokens, 2, 16),
        distributed.ShardedBatchLoader(tokens, 2, 16, _env(0, 1)),
    )
    for _ in range(3):
        loss_a = a.step(la)
        loss_b = distributed.distributed_step(b, lb)
        assert torch.equal(loss_a, loss_b)
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_state_bytes_counts_params_grads_and_both_adam_moments(tiny_config):
    trainer = _tiny_trainer(tiny_config, 1)
    n = sum(p.numel() for p in trainer.model.parameters())
    before = distributed.state_bytes(trainer.model, trainer.optimizer)
    assert before == {"params": 4 * n, "grads": 0, "optimizer": 0, "total": 4 * n}
    trainer.step(data.BatchLoader(data.load_tokens()[:5000], 2, 16))
    after = distributed.state_bytes(trainer.model, trainer.optimizer)
    n_tensors = len(list(trainer.model.parameters()))
    assert after["grads"] == 4 * n
    # exp_avg + exp_avg_sq, and a 0-d fp32 step each
    assert after["optimizer"] == 2 * 4 * n + 4 * n_tensors


def test_ddp_and_fsdp_refuse_a_single_process(tiny_config):
    trainer = _tiny_trainer(tiny_config, 1)
    with pytest.raises(ValueError, match="WORLD_SIZE > 1"):
        distributed.wrap_ddp(trainer, _env(0, 1))
    with pytest.raises(ValueError, match="WORLD_SIZE > 1"):
        distributed.wrap_fsdp(trainer, _env(0, 1))


def test_fsdp_on_a_cpu_is_refused_clearly_on_torch_2_4(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.4.1+cu121")
    assert "newer torch" in distributed.fsdp_unsupported_reason(torch.device("cpu"))
    assert distributed.fsdp_unsupported_reason(torch.device("cuda")) is None
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    assert distributed.fsdp_unsupported_reason(torch.device("cpu")) is None


def test_only_a_file_torch_save_wrote_counts_as_a_checkpoint(tmp_path):
    import zipfile

    docx = tmp_path / "report.docx"  # a zip archive too
    with zipfile.ZipFile(docx, "w") as z:
        z.writestr("word/document.xml", "<w/>")
    saved = tmp_path / "c.pt"
    torch.save({"step": 1}, saved)
    (tmp_path / "notes.txt").write_text("x")
    assert distributed.is_checkpoint(saved)
    assert not distributed.is_checkpoint(docx) and not distributed.is_checkpoint(
        tmp_path / "notes.txt"
    )
    assert not distributed.is_checkpoint(tmp_path / "missing.pt")
