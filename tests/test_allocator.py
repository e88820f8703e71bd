"""helpers.measure.allocator: what runs without a GPU, and how the fragmentation pattern is
launched (a fresh process with the allocator setting, no emulation inherited)."""

import json
import subprocess
import sys

import pytest
import torch

from helpers import REPO_ROOT
from helpers.measure import allocator, snapshot


def test_without_cuda_the_counters_are_none_and_the_cuda_demonstrations_refuse():
    assert allocator.stats("cpu") is None
    with pytest.raises(ValueError, match="GPU"):
        allocator.empty_cache_effect("cpu", lambda: None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_fragmentation_needs_cuda_and_says_so():
    result = allocator.run_fragmentation(expandable=True)
    assert result["status"] == "needs CUDA" and "expandable" in result["reason"]
    with pytest.raises(ValueError, match="GPU"):
        allocator.fragmentation_pattern()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_the_command_line_fails_in_one_line_without_a_gpu():
    out = subprocess.run(
        [sys.executable, "-m", "helpers.measure.allocator", "fragment"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert out.returncode == 2 and out.stderr.strip().startswith("error: the fragmentation")


def test_run_fragmentation_starts_a_fresh_process_with_the_allocator_setting(monkeypatch):
    seen = {}

    def fake_run(cmd, env, capture_output, text, timeout):
        seen.update(cmd=cmd, env=env)
        line = json.dumps({"status": "measured", "outcome": "fits"})
        return subprocess.CompletedProcess(cmd, 0, stdout=f"noise\n{line}\n", stderr="")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(allocator.subprocess, "run", fake_run)
    monkeypatch.setenv("COURSE_EMULATE_GPU", "T4")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    assert allocator.run_fragmentation(False, cap_bytes=15 * 10**9)["outcome"] == "fits"
    assert seen["cmd"][1:] == [
        "-m",
        "helpers.measure.allocator",
        "fragment",
        "--cap-bytes",
        "15000000000",
    ]
    assert seen["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    assert "COURSE_EMULATE_GPU" not in seen["env"] and "PYTORCH_ALLOC_CONF" not in seen["env"]
    assert seen["env"]["PYTHONPATH"].split(":")[0] == str(REPO_ROOT)


def test_a_failing_child_is_reported_not_raised(monkeypatch):
    def fake_run(cmd, env, capture_output, text, timeout):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="Traceback ...\nboom")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(allocator.subprocess, "run", fake_run)
    result = allocator.run_fragmentation(True)
    assert result["status"] == "failed" and result["error"].endswith("boom")


def test_phase_stats_only_mark_the_phases_on_a_cpu():
    markers = snapshot.Markers("cpu")
    phases = allocator.PhaseStats("cpu", markers)
    phases.prefix = "1:"
    with phases("forward"):
        torch.ones(10)
    assert phases.rows == [] and list(markers.sizes.values()) == ["1:forward"]
