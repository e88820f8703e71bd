"""benchmarks/loss_check.py's bookkeeping (seeds, skipped variants, the 1% verdict, the JSON
written after each row), with the training replaced by fixed losses: the check itself needs a
GPU and runs on the H200 (results/h200-loss-check-*.json)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from helpers.core.train import RunConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def loss_check(monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(
            "loss_check", ROOT / "benchmarks/loss_check.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    plain = RunConfig(name="+ bf16 autocast", autocast="bf16")
    final = RunConfig(name="+ fp8 LM head", autocast="bf16", compile="default")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(module.data, "load_tokens", lambda: torch.zeros(10, dtype=torch.long))
    monkeypatch.setattr(module, "ladder_configs", lambda *a, **k: [(plain, None), (final, None)])
    monkeypatch.setattr(module, "last_runnable", lambda *a: final)
    monkeypatch.setattr(module.results, "provenance", lambda device: {"device": str(device)})
    monkeypatch.setattr(
        module,
        "unsupported_reason",
        lambda run, device: "needs the fused loss" if run.name == "pytorch-ce" else None,
    )
    return module


def fake_losses(end_by_name_and_seed):
    def run_losses(run, steps, tokens, device, variant="final"):
        return [end_by_name_and_seed[(run.name, run.seed)]] * steps

    return run_losses


def test_every_seed_is_a_pair_and_a_skipped_variant_is_recorded(loss_check, monkeypatch, tmp_path):
    ends = {
        ("+ bf16 autocast", 1): 5.0,
        ("final", 1): 5.04,
        ("+ bf16 autocast", 2): 5.2,
        ("final", 2): 5.19,
    }
    monkeypatch.setattr(loss_check, "run_losses", fake_losses(ends))
    out = tmp_path / "check.json"
    rc = loss_check.main(
        [
            "--steps",
            "20",
            "--variants",
            "final",
            "pytorch-ce",
            "--seeds",
            "1",
            "2",
            "--out",
            str(out),
        ]
    )
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["passed"] and doc["seeds"] == [1, 2]
    assert [(r["seed"], "skipped" in r) for r in doc["rows"]] == [
        (1, False),
        (1, False),
        (1, True),
        (2, False),
        (2, False),
        (2, True),
    ]
    assert doc["rows"][1]["rel_diff"] == pytest.approx(0.008)
    assert doc["rows"][2]["skipped"] == "needs the fused loss"


def test_one_seed_outside_the_tolerance_fails_the_check(loss_check, monkeypatch, tmp_path):
    ends = {
        ("+ bf16 autocast", 1): 5.0,
        ("final", 1): 5.0,
        ("+ bf16 autocast", 2): 5.0,
        ("final", 2): 4.9,
    }  # -2%
    monkeypatch.setattr(loss_check, "run_losses", fake_losses(ends))
    out = tmp_path / "check.json"
    assert loss_check.main(["--steps", "20", "--seeds", "1", "2", "--out", str(out)]) == 1
    assert json.loads(out.read_text())["passed"] is False


def test_repeats_are_summarised_against_the_plain_rung(loss_check, monkeypatch, tmp_path):
    # seed 1: the last rung's three runs straddle the plain loss (noise), one of them 2% off, so
    # the verdict fails while the mean is within 1%; seed 2: all three runs 3% low
    ends = {1: [5.1, 4.95, 4.98], 2: [4.85, 4.85, 4.86]}
    calls = {1: 0, 2: 0}

    def run_losses(run, steps, tokens, device, variant="final"):
        if run.name == "+ bf16 autocast":
            return [5.0] * steps
        i = calls[run.seed]
        calls[run.seed] += 1
        return [ends[run.seed][i]] * steps

    monkeypatch.setattr(loss_check, "run_losses", run_losses)
    out = tmp_path / "check.json"
    argv = ["--steps", "20", "--seeds", "1", "2", "--repeats", "3", "--out", str(out)]
    assert loss_check.main(argv) == 1
    doc = json.loads(out.read_text())
    assert doc["passed"] is False and doc["repeats"] == 3
    assert [r.get("repeat") for r in doc["rows"]] == [None, 0, 1, 2, None, 0, 1, 2]
    s1, s2 = doc["summary"]
    assert (s1["seed"], s1["runs"]) == (1, 3)
    assert (s1["lowest"], s1["highest"]) == (pytest.approx(4.95), pytest.approx(5.1))
    assert s1["mean"] == pytest.approx(5.01) and s1["mean_within_tolerance"]
    assert s1["plain_inside_range"]
    assert s2["mean_rel_diff"] == pytest.approx(-0.02933, abs=1e-5)
    assert not s2["mean_within_tolerance"] and not s2["plain_inside_range"]
    # constant curves: the runs are |5.1 - 4.95|, |5.1 - 4.98|, |4.95 - 4.98| apart at every step
    assert s1["step_diff"] == pytest.approx((0.15 + 0.12 + 0.03) / 3)
    assert s2["step_diff"] == pytest.approx(0.02 / 3)


def test_step_diff_reads_the_second_half_of_every_pair_of_curves(loss_check):
    a = [9.0, 9.0, 5.0, 5.0]
    b = [1.0, 1.0, 5.5, 4.0]  # apart by 8 in the first half, by 0.5 and 1.0 in the second
    assert loss_check.step_diff([a, b]) == pytest.approx(0.75)
    assert loss_check.step_diff([a, b, a]) == pytest.approx((0.75 + 0.0 + 0.75) / 3)
    assert loss_check.step_diff([a]) is None
    with pytest.raises(ValueError, match="different lengths"):
        loss_check.step_diff([a, b[:3]])


def test_repeats_below_one_are_refused(loss_check):
    with pytest.raises(SystemExit):
        loss_check.main(["--repeats", "0"])


def test_variants_combine_with_plus_and_an_unknown_part_is_refused(loss_check, monkeypatch):
    perf = sys.modules["perf"]
    assert perf.switches("reduce-overhead+no-clip") == {
        "compile": "reduce-overhead",
        "grad_clip": None,
    }
    seen = []
    monkeypatch.setattr(loss_check, "run_losses", lambda run, *a: seen.append(run) or [5.0] * 200)
    assert loss_check.main(["--variants", "reduce-overhead+no-clip"]) == 0
    combined = seen[-1]
    assert (combined.name, combined.compile, combined.grad_clip) == (
        "reduce-overhead+no-clip",
        "reduce-overhead",
        None,
    )
    with pytest.raises(SystemExit):
        loss_check.main(["--variants", "reduce-overhead+not-a-variant"])
    # each part's context is entered: a combined inductor setting is set inside, restored after
    import torch._inductor.config as inductor_config

    before = inductor_config.triton.mix_order_reduction_split_size
    with perf.experiment("mix-order-split-64+no-clip"):
        assert inductor_config.triton.mix_order_reduction_split_size == 64
    assert inductor_config.triton.mix_order_reduction_split_size == before


def test_the_deterministic_variant_is_restored_afterwards(loss_check):
    perf = sys.modules["perf"]
    assert not torch.are_deterministic_algorithms_enabled()
    with perf.experiment("deterministic"):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert not torch.are_deterministic_algorithms_enabled()


def test_perf_launchers_needs_profile_and_a_valid_pattern(loss_check, capsys):
    """perf.py refuses --launchers without --profile, and a pattern that is not a regular
    expression, before it looks for a GPU."""
    perf = sys.modules["perf"]
    with pytest.raises(SystemExit) as e:
        perf.main(["--launchers", "reduce_kernel"])
    assert e.value.code == 2
    assert "--launchers goes with --profile" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        perf.main(["--profile", "--launchers", "reduce_kernel("])
    assert e.value.code == 2
    assert "not a regular expression" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        perf.main(["--profile", "--launchers", ""])
    assert e.value.code == 2
    assert "empty pattern" in capsys.readouterr().err
