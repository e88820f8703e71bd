"""Tests for helpers/chapters/ch11_multi_gpu.py: sharding, the distributed step, and real 2-process
runs (gloo, CPU).

The multi-process tests start ``torchrun --standalone --nproc_per_node=2`` (``--standalone`` picks a
free port, so concurrent runs never clash) on the tests' tiny model (2 layers of width 32), T=32,
fp32, 2 optimizer steps, and compare with one process trained in this test process over the same
global batch.
"""

import pytest
import torch

from helpers.chapters import ch11_multi_gpu as distributed
from helpers.core import data, train

# DDP's all-reduce averages in another order than one process's mean over the batch: after 2 AdamW
# steps parameters differ by ~5e-6. A missing all-reduce, a shard that repeats or skips rows, or
# an accumulation step that forgets to divide moves them by ~lr = 6e-4 or more.
PARAM_TOL = 5e-5
COMMON = ["--steps", "2", "--warmup", "0", "--seq-len", "32", "--device", "cpu", "--model", "tiny"]


def _env(rank: int, world: int) -> distributed.DistEnv:
    return distributed.DistEnv(
        rank, rank, world, torch.device("cpu"), "gloo" if world > 1 else None
    )


# ---- pure: no process group --------------------------------------------------------------------


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
    assert (
        after["optimizer"] == 2 * 4 * n + 4 * n_tensors
    )  # exp_avg + exp_avg_sq, and a 0-d fp32 step each


def test_ddp_and_fsdp_refuse_a_single_process(tiny_config):
    trainer = _tiny_trainer(tiny_config, 1)
    with pytest.raises(ValueError, match="WORLD_SIZE > 1"):
        distributed.wrap_ddp(trainer, _env(0, 1))
    with pytest.raises(ValueError, match="WORLD_SIZE > 1"):
        distributed.wrap_fsdp(trainer, _env(0, 1))


# ---- real 2-process runs (torchrun, gloo) ------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, global batch of 4 rows, no accumulation:
    the run every 2-process run must match."""
    path = tmp_path_factory.mktemp("ch11") / "single.pt"
    summary = distributed.run_here([*COMMON, "--batch-size", "4", "--checkpoint", str(path)])
    return summary, path


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("ch11") / "ddp.pt"
    args = [*COMMON, "--batch-size", "2", "--count-allreduces", "--checkpoint", str(path)]
    return distributed.launch(2, args, timeout_s=300), path


def test_ddp_on_two_processes_equals_one_process_over_the_same_global_batch(reference, ddp_run):
    (single, single_path), (ddp, ddp_path) = reference, ddp_run
    assert (ddp["world_size"], ddp["backend"], ddp["tokens_per_step"]) == (
        2,
        "gloo",
        single["tokens_per_step"],
    )
    assert distributed.max_param_diff(ddp_path, single_path) < PARAM_TOL
    assert ddp["losses"] == pytest.approx(single["losses"], abs=1e-4)
    sums = ddp["param_sum_per_rank"]
    assert len(sums) == 2 and sums[0] == sums[1]  # the replicas stayed identical
    assert ddp["allreduce_calls_last_step"] >= 1
    ckpt = torch.load(ddp_path)
    assert ckpt["step"] == 2 and ckpt["world_size"] == 2 and "state" in ckpt["optimizer"]


def test_no_sync_accumulation_equals_one_big_batch_and_all_reduces_once(
    tmp_path, reference, ddp_run
):
    (_, single_path), (ddp, _) = reference, ddp_run
    path = tmp_path / "accum.pt"
    args = [
        *COMMON,
        "--batch-size",
        "1",
        "--grad-accum",
        "2",
        "--count-allreduces",
        "--checkpoint",
        str(path),
    ]
    accum = distributed.launch(2, args, timeout_s=300)
    assert accum["tokens_per_step"] == ddp["tokens_per_step"]
    assert distributed.max_param_diff(path, single_path) < PARAM_TOL
    # no_sync on the first micro-step:
    # the same all-reduces per optimizer step as without accumulation
    assert accum["allreduce_calls_last_step"] == ddp["allreduce_calls_last_step"]


@pytest.mark.skipif(
    distributed.fsdp_unsupported_reason(torch.device("cpu")) is not None,
    reason="FSDP2 on a CPU is refused for this torch (see distributed.fsdp_unsupported_reason)",
)
def test_fsdp_on_two_processes_equals_one_process_and_halves_the_state(
    tmp_path, reference, ddp_run
):
    (_, single_path), (ddp, _) = reference, ddp_run
    path = tmp_path / "fsdp.pt"
    fsdp = distributed.launch(
        2,
        [*COMMON, "--batch-size", "2", "--mode", "fsdp", "--checkpoint", str(path)],
        timeout_s=300,
    )
    assert distributed.max_param_diff(path, single_path) < PARAM_TOL
    full, sharded = ddp["state_bytes_rank0"], fsdp["state_bytes_rank0"]
    for part in ("params", "grads"):
        assert sharded[part] == pytest.approx(full[part] / 2, rel=0.01)


def test_scaling_efficiency_is_tokens_per_s_over_n_times_one_process(monkeypatch):
    launched = []

    def fake_launch(nproc, args, timeout_s=600):
        launched.append((nproc, args[-1]))
        world = max(nproc, 1)
        return {
            "world_size": world,
            "mode": args[-1] if world > 1 else "single",
            "tokens_per_s": 1000.0 * world * (0.9 if world > 1 else 1.0),
            "step_ms": 10.0,
        }

    monkeypatch.setattr(distributed, "launch", fake_launch)
    result = distributed.scaling([1, 2, 4], ["ddp", "fsdp"], ["--steps", "3"])
    assert launched == [
        (0, "ddp"),
        (2, "ddp"),
        (4, "ddp"),
        (2, "fsdp"),
        (4, "fsdp"),
    ]  # N=1: a plain process, once
    assert [round(r["efficiency"], 6) for r in result["rows"]] == [1.0, 0.9, 0.9, 0.9, 0.9]


def test_train_command_refuses_zero_steps():
    with pytest.raises(SystemExit):
        distributed.main(["train", "--steps", "0"])


def test_train_is_the_default_command(monkeypatch):
    seen = []
    monkeypatch.setattr(distributed, "main_train", lambda args: seen.append(args) or 0)
    assert distributed.main(["--steps", "3", "--batch-size", "2"]) == 0
    assert (seen[0].steps, seen[0].batch_size, seen[0].mode) == (3, 2, "ddp")


def test_fsdp_on_a_cpu_is_refused_clearly_on_torch_2_4(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.4.1+cu121")
    assert "newer torch" in distributed.fsdp_unsupported_reason(torch.device("cpu"))
    assert distributed.fsdp_unsupported_reason(torch.device("cuda")) is None
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    assert distributed.fsdp_unsupported_reason(torch.device("cpu")) is None
