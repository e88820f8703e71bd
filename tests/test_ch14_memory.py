"""helpers.chapters.ch14_memory and ch14_estimate: the recorded steps, what holds the peak, the
estimates against the snapshot and the committed peaks, and the command line, on a CPU."""

import json
import re

import pytest
import torch

from helpers.chapters import ch14_estimate as est
from helpers.chapters import ch14_memory as ch14
from helpers.core import train
from helpers.core.model import GPTConfig

TINY = GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=32)


@pytest.fixture(scope="module")
def steps():
    run = train.RunConfig(batch_size=2, seq_len=32)
    return ch14.record_steps(run, TINY, "cpu")


def _n_params() -> int:
    run = train.RunConfig(batch_size=1, seq_len=8)
    return sum(p.numel() for p in train.build(run, TINY, "cpu").model.parameters())


def test_three_steps_show_adamw_state_made_in_step_1_and_gradients_kept_in_step_3(steps):
    assert steps.timeline.consistent
    assert [(r["step"], r["phase"]) for r in steps.phases if r["step"] == 1] == [
        (1, p) for p in ("zero_grad", "data", "forward", "backward", "clip", "optimizer")
    ]
    start = {r["step"]: r["start"] for r in steps.phases if r["phase"] == "forward"}
    n = _n_params()
    assert start[2] - start[1] == pytest.approx(8 * n, rel=0.01)  # exp_avg, exp_avg_sq
    assert start[3] - start[2] == pytest.approx(4 * n, rel=0.01)  # set_to_none=False
    findings = ch14.first_step_findings(steps, "MiB")
    assert findings[1].startswith("step 2: peak") and "AdamW state" in findings[3]
    assert all(r["reserved"] is None for r in steps.phases)  # no allocator counters on a CPU


def test_the_peak_is_in_the_losss_backward_and_held_by_logits_sized_tensors(steps):
    peak = steps.step_peak(2)
    assert peak["phase"] == "backward" and peak["max_allocated"] is None
    parts, blocks = ch14.peak_blocks(steps, 2)
    B, T, V = 2, 32, TINY.padded_vocab_size
    assert parts["logits-sized (B, T, V)"] == 4 * B * T * V * 4  # logits, log-softmax, 2 grads
    # exp_avg and exp_avg_sq, and on a CPU the 4-byte step counters
    assert parts["AdamW state"] == pytest.approx(8 * _n_params(), abs=1024)
    assert "gradients" not in parts
    assert sum(parts.values()) == peak["bytes"]
    # file:line function; the line moves whenever model.py is edited, the file and function do not
    where = re.fullmatch(r"(model\.py):\d+ (\w+)", blocks[0]["where"])
    assert where and where.groups() in (
        ("model.py", "_lm_head"),
        ("model.py", "_pytorch_cross_entropy"),
    ), blocks[0]["where"]


def test_chapter_14s_estimate_matches_the_cpu_snapshot_term_by_term(steps):
    parts, _ = ch14.peak_blocks(steps, 2)
    rows = est.estimate_rows(steps.run, TINY, parts, steps.step_peak(2)["bytes"], "MiB")
    by = {r[0]: r for r in rows}
    for term in ("parameters", "AdamW state", "logits-sized tensors", "(T, T) attention scores"):
        assert by[term][2] == by[term][3], by[term]  # chapter 14's column = the snapshot's
    assert by["gradients"][1] != by["gradients"][3]  # chapter 03 counts gradients at the peak
    total = float(by["total"][3].replace(",", ""))
    assert float(by["total"][2].replace(",", "")) == pytest.approx(total, rel=0.05)


def test_variants_skip_what_the_cpu_cannot_run_and_leave_it_out_later(monkeypatch):
    monkeypatch.setenv("COURSE_CPU_BF16", "slow")
    rows = ch14.measure_variants(train.RunConfig(batch_size=2, seq_len=32), TINY, "cpu")
    status = {r["name"]: r["status"] for r in rows}
    assert status == {
        "fp32, manual attention": "measured",
        "+ bf16 autocast": "skipped",
        "+ SDPA": "measured",
        "+ fused LM-head CE": "skipped",
        "+ checkpoint every block": "measured",
    }
    last = rows[-1]["switches"]
    assert last == {
        "autocast": None,
        "attention": "sdpa",
        "loss_kernel": "pytorch",
        "checkpoint_every": 1,
    }
    manual, sdpa = rows[0], rows[2]
    assert sdpa["peak"] < manual["peak"] and manual["estimate"] is not None
    header, cells = ch14.variant_table(rows, "MiB")
    assert header[1] == "peak (MiB)" and cells[1][-1].startswith("skipped: ")


def test_summary_is_small_json_with_the_peak_and_a_timeline(steps):
    summary = ch14.snapshot_summary(steps)
    text = json.dumps(summary)
    assert len(text) < 200_000 and summary["peak_phase"] == "backward"
    assert [summary["points"][0][0] <= i for i, _ in summary["phases"]]
    assert max(b for _, b in summary["points"]) == summary["peak_bytes"]
    fig = ch14.step_plot(summary["points"], summary["phases"], "t", {})
    assert {t.get_text() for t in fig.axes[0].texts} >= {"forward", "backward"}


def test_batch_choices_give_a_40gb_gpu_b16_where_chapter_03_gave_8():
    rows = {r[0]: r for r in est.batch_choices()}
    assert rows["A100-40GB"][2:] == [8, 16] and rows["T4"][2:] == [4, 4]
    assert rows["H200"][3] == 16


def test_committed_check_rows_show_both_estimates_against_the_measurement():
    peaks = est.committed_eager_peaks()
    if not peaks:
        pytest.skip("no committed H200 results in this checkout")
    rows = est.committed_check_rows(peaks)
    fp32 = next(r for r in rows if r[0] == "precision fp32, B=16")
    assert fp32[1] == "34.20" and fp32[2].startswith("44.16 (+29.1%") and "-0.3%" in fp32[3]
    b64 = next(r for r in rows if r[0] == "ladder fp32, B=64")  # 132.01 GB measured
    assert b64[1] == "132.01" and "-0.1%" in b64[3]


def test_without_cuda_the_gpu_demonstrations_say_what_they_need():
    if torch.cuda.is_available():
        pytest.skip("the CPU path")
    assert {r["status"] for r in ch14.fragmentation_runs()} == {"needs CUDA"}
    assert ch14.fragmentation_table(ch14.fragmentation_runs()) is None
    assert est.a100_check()["status"] == "needs CUDA"


def test_fragmentation_table_reads_the_patterns_json():
    run = {
        "status": "measured",
        "expandable_segments": False,
        "request_bytes": 2 * 2**30,
        "outcome": "out of memory",
        "before": {
            "reserved": 15 * 2**30,
            "allocated": 8 * 2**30,
            "free_in_segments": 7 * 2**30,
            "largest_free": 2**30,
        },
        "after": {"reserved": 15 * 2**30, "peak_reserved": 15 * 2**30},
    }
    header, cells = ch14.fragmentation_table([run, {"status": "failed"}])
    assert len(header) == len(cells[1]) == 10 and header[5] == "fragmentation"
    assert cells[0] == [
        "False",
        "15.00",
        "8.00",
        "7.00",
        "1.00",
        "0.86",  # 1 - 1/7
        "2.00",
        "out of memory",
        "15.00",
        "15.00",
    ]
    assert cells[1][7] == "failed" and len(header) == len(cells[0])


def test_committed_finds_the_newest_summary(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    assert ch14.committed() == (None, "h200-memory-<date>.json")
    for date in ("2026-12-02", "2026-12-03"):
        (tmp_path / f"h200-memory-{date}.json").write_text(json.dumps({"date": date}))
    assert ch14.committed() == ({"date": "2026-12-03"}, "h200-memory-2026-12-03.json")


def test_record_refuses_to_replace_a_file_without_force_before_measuring(tmp_path, capsys):
    out = tmp_path / "memory.json"
    out.write_text("{}")
    assert ch14.main(["record", "--out", str(out), "--device", "cpu"]) == 2
    assert "pass --force" in capsys.readouterr().err
    (tmp_path / "new.png").write_text("x")
    args = ["record", "--out", str(tmp_path / "new.json"), "--plot", str(tmp_path / "new.png")]
    assert ch14.main(args) == 2
    assert "new.png exists" in capsys.readouterr().err
