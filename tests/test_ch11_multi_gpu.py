"""Tests for helpers/chapters/ch11_multi_gpu.py: real 2-process runs (gloo, CPU), the scaling
table and the command line. The mechanism without a process group: tests/test_distributed.py.

The multi-process tests start ``torchrun --standalone --nproc_per_node=2`` (``--standalone`` picks a
free port, so concurrent runs never clash) on the tests' tiny model (2 layers of width 32), T=32,
fp32, 2 optimizer steps, and compare with one process trained in this test process over the same
global batch.
"""

import pytest
import torch

from helpers.chapters import ch11_multi_gpu
from helpers.core import collectives, distributed

# DDP's all-reduce averages in another order than one process's mean over the batch: after 2 AdamW
# steps parameters differ by ~5e-6. A missing all-reduce, a shard that repeats or skips rows, or
# an accumulation step that forgets to divide moves them by ~lr = 6e-4 or more.
PARAM_TOL = 5e-5
COMMON = ["--steps", "2", "--warmup", "0", "--seq-len", "32", "--device", "cpu", "--model", "tiny"]


# ---- real 2-process runs (torchrun, gloo) ------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, global batch of 4 rows, no accumulation:
    the run every 2-process run must match."""
    path = tmp_path_factory.mktemp("ch11") / "single.pt"
    summary = ch11_multi_gpu.run_here([*COMMON, "--batch-size", "4", "--checkpoint", str(path)])
    return summary, path


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("ch11") / "ddp.pt"
    args = [*COMMON, "--batch-size", "2", "--count-allreduces", "--checkpoint", str(path)]
    return ch11_multi_gpu.launch(2, args, timeout_s=300), path


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
    accum = ch11_multi_gpu.launch(2, args, timeout_s=300)
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
    fsdp = ch11_multi_gpu.launch(
        2,
        [*COMMON, "--batch-size", "2", "--mode", "fsdp", "--checkpoint", str(path)],
        timeout_s=300,
    )
    assert distributed.max_param_diff(path, single_path) < PARAM_TOL
    full, sharded = ddp["state_bytes_rank0"], fsdp["state_bytes_rank0"]
    for part in ("params", "grads"):
        assert sharded[part] == pytest.approx(full[part] / 2, rel=0.01)


FSDP_CPU = pytest.mark.skipif(
    distributed.fsdp_unsupported_reason(torch.device("cpu")) is not None,
    reason="FSDP2 on a CPU is refused for this torch (see distributed.fsdp_unsupported_reason)",
)
TRAFFIC = ["--steps", "1", "--warmup", "0", "--seq-len", "32", "--device", "cpu", "--model", "tiny"]


@FSDP_CPU
def test_fsdp_traffic_on_two_processes_equals_the_arithmetic():
    summary = ch11_multi_gpu.launch(
        2, [*TRAFFIC, "--batch-size", "2"], timeout_s=300, command="fsdp-traffic"
    )
    rows = {r["variant"]: r for r in summary["rows"]}
    assert summary["world_size"] == 2 and summary["backend"] == "gloo"
    assert rows["no wrapper"]["collectives"] == {}
    ddp = rows["DDP"]
    assert ddp["collectives"]["all_reduce"]["bytes"] == ddp["state_bytes_rank0"]["params"]
    fsdp = [r for r in summary["rows"] if r["wrapper"] == "fsdp"]
    assert all(collectives.matches(r["collectives"], r["expected"]) for r in fsdp)
    gathers = {r["variant"]: r["collectives"]["all_gather"] for r in fsdp}
    # 3 units (2 blocks + root): forward gathers each; backward the ones freed after forward
    assert gathers["FSDP (default: root kept)"]["count"] == 3 + 2
    assert gathers["FSDP reshard_after_forward=True"]["count"] == 3 + 3
    assert gathers["FSDP reshard_after_forward=False"]["count"] == 3
    assert gathers["FSDP param_dtype=bf16"]["dtypes"] == ["torch.bfloat16"]
    assert (
        2 * gathers["FSDP param_dtype=bf16"]["bytes"]
        == gathers["FSDP (default: root kept)"]["bytes"]
    )
    for r in fsdp:  # every unit's gradients once, in fp32 (bf16 run: reduce_dtype=fp32)
        assert r["collectives"]["reduce_scatter"]["count"] == 3
        assert r["collectives"]["reduce_scatter"]["dtypes"] == ["torch.float32"]
    lines = ch11_multi_gpu.traffic_conclusions(summary)
    assert "equal the arithmetic in 4 of 4 FSDP variants" in lines[0]
    assert "2.00x the bytes of False" in lines[1] and "0.50x" in lines[2]
    assert "| variant | all-gather |" in ch11_multi_gpu.traffic_table(summary)


@FSDP_CPU
def test_fsdp_traffic_runs_on_one_process_with_a_group_of_one():
    summary = ch11_multi_gpu.launch(
        1, [*TRAFFIC, "--batch-size", "2"], timeout_s=300, command="fsdp-traffic"
    )
    assert summary["world_size"] == 1 and summary["backend"] == "gloo"
    fsdp = [r for r in summary["rows"] if r["wrapper"] == "fsdp"]
    assert len(fsdp) == 4 and all(r["step_ms"] > 0 for r in fsdp)
    # one rank holds every row: this torch copies instead of gathering, or gathers exactly
    for r in fsdp:
        assert not r["collectives"].get("all_gather") or collectives.matches(
            r["collectives"], r["expected"]
        )
    assert ch11_multi_gpu.traffic_conclusions(summary)[0].startswith("world size 1")


# ---- the scaling table and the command line ---------------------------------------------------


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

    monkeypatch.setattr(ch11_multi_gpu, "launch", fake_launch)
    result = ch11_multi_gpu.scaling([1, 2, 4], ["ddp", "fsdp"], ["--steps", "3"])
    # N=1: a plain process, once
    assert launched == [(0, "ddp"), (2, "ddp"), (4, "ddp"), (2, "fsdp"), (4, "fsdp")]
    assert [round(r["efficiency"], 6) for r in result["rows"]] == [1.0, 0.9, 0.9, 0.9, 0.9]


def test_train_command_refuses_zero_steps():
    with pytest.raises(SystemExit):
        ch11_multi_gpu.main(["train", "--steps", "0"])


def test_train_is_the_default_command(monkeypatch):
    seen = []
    monkeypatch.setattr(ch11_multi_gpu, "main_train", lambda args: seen.append(args) or 0)
    assert ch11_multi_gpu.main(["--steps", "3", "--batch-size", "2"]) == 0
    assert (seen[0].steps, seen[0].batch_size, seen[0].mode) == (3, 2, "ddp")
