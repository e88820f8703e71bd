"""Tests for helpers/core/collectives.py: FSDP's traffic arithmetic by hand, and the recorder on a
one-process gloo group. The recorder on real FSDP runs: tests/test_ch11_multi_gpu.py."""

import pytest
import torch
import torch.distributed as dist

from helpers.core import collectives


def test_padded_numel_rounds_the_first_dimension_up_to_the_world_size():
    assert collectives.padded_numel([50257, 32], 2) == 50258 * 32
    assert collectives.padded_numel([50257, 32], 1) == 50257 * 32
    assert collectives.padded_numel([3], 4) == 4
    assert collectives.padded_numel([], 2) == 1
    with pytest.raises(ValueError):
        collectives.padded_numel([4], 0)


def test_expected_traffic_gathers_a_resharded_unit_twice_and_reduces_every_unit_once():
    # unit 0: a (4, 2) weight, freed after forward; unit 1: a (3,) bias padded to 4, kept
    units = [[[4, 2]], [[3]]]
    fp32 = collectives.expected_fsdp_traffic(units, [True, False], world_size=2)
    assert fp32 == {
        "all_gather": {"count": 3, "bytes": (2 * 8 + 4) * 4},
        "reduce_scatter": {"count": 2, "bytes": (8 + 4) * 4},
    }
    mixed = collectives.expected_fsdp_traffic(
        units, [True, False], 2, param_dtype=torch.bfloat16, reduce_dtype=torch.float32
    )
    assert mixed["all_gather"]["bytes"] == (2 * 8 + 4) * 2  # gathered in bf16
    assert mixed["reduce_scatter"] == fp32["reduce_scatter"]  # gradients summed in fp32
    bf16 = collectives.expected_fsdp_traffic(units, [False, False], 2, torch.bfloat16)
    assert bf16["reduce_scatter"]["bytes"] == (8 + 4) * 2  # reduce_dtype defaults to param_dtype
    with pytest.raises(ValueError):
        collectives.expected_fsdp_traffic(units, [True], 2)


def test_matches_needs_both_count_and_bytes():
    want = {"all_gather": {"count": 3, "bytes": 80}}
    assert collectives.matches({"all_gather": {"count": 3, "bytes": 80, "dtypes": []}}, want)
    assert not collectives.matches({"all_gather": {"count": 3, "bytes": 40}}, want)
    assert not collectives.matches({"all_gather": {"count": 2, "bytes": 80}}, want)
    assert not collectives.matches({}, want)


def test_recorder_counts_collectives_with_their_bytes_and_ignores_other_ops():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        x = torch.ones(10)
        with collectives.CollectiveRecorder() as rec:
            y = x * 2  # not a collective
            dist.all_reduce(y)
            out = torch.empty(10)
            dist.all_gather_into_tensor(out, x)
        assert [c.kind for c in rec.calls] == ["all_reduce", "all_gather"]
        assert rec.summary()["all_reduce"] == {"count": 1, "bytes": 40, "dtypes": ["torch.float32"]}
        assert rec.summary()["all_gather"]["bytes"] == 40
    finally:
        dist.destroy_process_group()
