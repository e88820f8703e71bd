"""Tests for helpers/chapters/ch10_profiling.py: profile tables, the chapter's advice and its
command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.chapters import ch10_profiling as profiling
from helpers.measure import profiler

RESULTS = Path(__file__).resolve().parents[1] / "results"


@pytest.fixture(scope="module")
def perf():
    return json.loads((RESULTS / "h200-perf-final-2026-11-30.json").read_text())


def test_table_from_perf_json_keeps_the_measured_family_totals_and_kernels(perf):
    table = profiling.table_from_perf_json(perf, source="x", date="2026-11-29", cuda="13.0")
    by_b = {t["batch_size"]: t for t in table["tables"]}
    assert (
        sorted(by_b) == [16, 64] and len(table["tables"]) == 2
    )  # the "final" rows only, one per B
    assert any(
        r["variant"] != "final" for r in perf["rows"]
    )  # the file has other variants, left out
    for row in perf["rows"]:
        if "profile" not in row or row["variant"] != "final":
            continue
        t = by_b[row["batch_size"]]
        want = {profiling.PERF_FAMILIES[k]: v for k, v in row["profile"]["families_ms"].items()}
        assert profiler.family_totals(t["kernels"]) == pytest.approx(want)
        listed = [(r["ms"], r["name"]) for r in t["kernels"] if not r["remainder"]]
        assert sorted(listed) == sorted(tuple(k) for k in row["profile"]["top_kernels_ms"])
        assert all(
            r["calls"] is None and r["name"].startswith("(rest of")
            for r in t["kernels"]
            if r["remainder"]
        )
        assert t["step_ms"] == row["ms_per_step"]


def test_table_from_perf_json_adds_perf_families_that_map_to_one_family(perf):
    """A max-autotune run splits matmul time into cuBLAS and Triton-template families;
    the table sums them."""
    perf = json.loads(json.dumps(perf))
    row = next(r for r in perf["rows"] if r["variant"] == "final" and "profile" in r)
    fams = row["profile"]["families_ms"]
    fams["matmul (inductor Triton template)"] = 2.5
    row["profile"]["top_kernels_ms"].append([2.5, "triton_tem_fused_addmm_gelu_0"])
    table = profiling.table_from_perf_json(perf, source="x", date="2026-11-30")
    t = next(t for t in table["tables"] if t["batch_size"] == row["batch_size"])
    assert t["families_ms"]["matmul"] == pytest.approx(fams["matmul"] + 2.5)
    assert (
        next(k for k in t["kernels"] if k["name"] == "triton_tem_fused_addmm_gelu_0")["family"]
        == "matmul"
    )
    assert (
        f"{len(row['profile']['top_kernels_ms'])} at B={row['batch_size']}" in table["derived"]
    )  # 16 here, 15 at the other B
    fams["a family perf.py never had"] = 1.0
    with pytest.raises(ValueError, match="add it to PERF_FAMILIES"):
        profiling.table_from_perf_json(perf, source="x", date="2026-11-30")


def test_shipped_table_is_exactly_the_derived_one(perf):
    shipped = json.loads((RESULTS / profiling.SHIPPED_TABLE).read_text())
    derived = profiling.table_from_perf_json(
        perf,
        source="results/h200-perf-final-2026-11-30.json (benchmarks/perf.py --profile)",
        date="2026-11-30",
        cuda="13.0",
    )
    assert shipped == json.loads(json.dumps(derived))
    assert shipped["device"] == "NVIDIA H200" and shipped["torch"].startswith("2.11")


def test_table_from_perf_json_refuses_inconsistent_input(perf):
    row = json.loads(json.dumps(next(r for r in perf["rows"] if "profile" in r)))
    bad_family = {"device": "x", "torch": "y", "rows": [json.loads(json.dumps(row))]}
    bad_family["rows"][0]["profile"]["families_ms"]["mystery"] = 1.0
    with pytest.raises(ValueError, match="unknown perf.py family"):
        profiling.table_from_perf_json(bad_family, "s", "d")
    too_small = {"device": "x", "torch": "y", "rows": [row]}
    row["profile"]["families_ms"]["matmul"] = 1.0
    with pytest.raises(ValueError, match="listed kernels sum"):
        profiling.table_from_perf_json(too_small, "s", "d")
    with pytest.raises(ValueError, match="--profile"):
        profiling.table_from_perf_json(
            {"device": "x", "torch": "y", "rows": [{"variant": "v"}]}, "s", "d"
        )


def test_load_table_and_provenance_line():
    prov, table = profiling.load_table(profiling.SHIPPED_TABLE, 16)
    line = profiling.provenance_line(prov, table)
    assert (
        "NVIDIA H200" in line and "torch 2.11" in line and "2026-11-30" in line and "B=16" in line
    )
    assert (
        line.splitlines()[1].startswith("  source: results/")
        and max(map(len, line.splitlines())) <= 100
    )
    with pytest.raises(KeyError, match="B=3"):
        profiling.load_table(profiling.SHIPPED_TABLE, 3)


def test_top_markdown_has_the_text_tables_rows_with_names_in_code_font():
    kernels = profiling.load_table(profiling.SHIPPED_TABLE, 16)[1]["kernels"]
    text = profiling.format_top(kernels, 5).splitlines()[1:]
    md = profiling.top_markdown(kernels, 5).splitlines()
    assert md[:2] == ["| ms/step | calls | family | name |", "|---:|---:|---|---|"] and len(md) == 7
    for text_row, md_row, kernel in zip(text, md[2:], kernels[:5], strict=True):
        ms, calls, family, name = md_row.strip("| ").split(" | ")
        assert text_row.split()[:2] == [ms, calls] and family == kernel["family"]
        marks = "*" if kernel.get("remainder") else "`"  # a remainder row is not a kernel name
        assert name.startswith(marks) and name.strip(marks) == text_row[31:]


@pytest.mark.parametrize(
    "rows,step_ms,low,want",
    [
        ([{"family": "matmul", "ms": 5.0}], 10.0, True, "ch05"),  # idle 50%
        (
            [{"family": "matmul", "ms": 9.0}, {"family": "attention", "ms": 0.5}],
            10.0,
            False,
            "ch04",
        ),
        ([{"family": "matmul", "ms": 9.0}, {"family": "attention", "ms": 0.5}], 10.0, True, "ch03"),
        (
            [
                {"family": "matmul", "ms": 4.0},
                {"family": "attention", "ms": 2.5},
                {"family": "attention", "ms": 2.5},
            ],
            10.0,
            True,
            "ch06",
        ),
        (
            [{"family": "matmul", "ms": 4.0}] + [{"family": "elementwise", "ms": 0.5}] * 10,
            10.0,
            True,
            "ch05",
        ),
        ([{"family": "optimizer", "ms": 9.0}], 10.0, True, "ch09"),
    ],
)
def test_suggest_chapter_rules(rows, step_ms, low, want):
    assert profiling.suggest_chapter(rows, step_ms, low) == want


def test_suggest_chapter_on_the_h200_tables_points_to_a_larger_batch():
    for b in (16, 64):
        _, table = profiling.load_table(profiling.SHIPPED_TABLE, b)
        assert profiling.suggest_chapter(table["kernels"], table["step_ms"], True) == "ch03"


def _table_args(out: Path) -> list[str]:
    """The smallest ``table`` run on a CPU: B=1, one eager step, no warm-up."""
    return ["table", "--out", str(out), "--eager", "--batch-size", "1", "--steps", "1",
            "--warmup", "0", "--iters", "1"]  # fmt: skip


def test_cli_table_and_run_on_this_device(tmp_path, capsys):
    out = tmp_path / "table.json"
    assert profiling.main(_table_args(out)) == 0
    table = json.loads(out.read_text())
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"  # a GPU host
    assert table["device"] == device and table["torch"] == torch.__version__ and table["date"]
    (entry,) = table["tables"]
    assert (
        entry["batch_size"] == 1
        and entry["kernels"]
        and entry["step_ms"] > 0
        and "autocast" in entry["config"]
    )
    assert profiler.family_totals(entry["kernels"]) == pytest.approx(entry["families_ms"])
    assert (
        profiling.main(["run", "--steps", "1", "--warmup", "0", "--batch-size", "1", "--eager"])
        == 0
    )
    assert "ms/step over 1 steps" in capsys.readouterr().out
    run = ["run", "--steps", "1", "--warmup", "0", "--batch-size", "1", "--eager"]
    assert profiling.main([*run, "--chapter-step"]) == 0
    assert "the ladder up to '+ " in capsys.readouterr().out


def test_chapter_rung_uses_only_switches_taught_by_chapter_09(monkeypatch):
    from helpers import switches

    run = profiling.chapter_rung(4, 64, "cpu", eager=True)
    assert not switches.taught_after(run, "09") and run.compile is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # an H200, as tests/test_ladder
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    gpu = profiling.chapter_rung(16, 1024, "cuda")
    assert gpu.name == "the ladder up to '+ vocab 50304'" and gpu.compile == "default"
    assert (gpu.optimizer, gpu.loss_kernel, gpu.residual_dtype) == ("foreach", "pytorch", "fp32")


def test_ratio_rows_split_backward_over_forward_by_family():
    prof = profiler.StepProfile(
        "cuda",
        "fake",
        1,
        [],
        {"forward": 3.0, "backward": 5.0},
        8.0,
        8.0,
        8.0,
        phase_families_ms={
            "forward": {"matmul": 2.0, "attention": 1.0},
            "backward": {"matmul": 4.0, "reduction": 1.0},
        },
    )
    assert profiling.ratio_rows(prof) == [
        ["matmul", "2.00", "4.00", "2.00"],
        ["reduction", "0.00", "1.00", "-"],
        ["attention", "1.00", "0.00", "0.00"],
        ["all kernels", "3.00", "5.00", "1.67"],
    ]


def test_cli_trace_path_is_checked_before_the_run(tmp_path, capsys):
    """--trace obeys the course's output rule: a file that is not a trace (a README, a notebook)
    is refused with one line before anything is measured, and left as it was."""
    readme = tmp_path / "README.md"
    readme.write_text("# keep me\n")
    table = _table_args(tmp_path / "t.json")
    for bad in (readme, tmp_path / "solution.ipynb", tmp_path / "trace.txt"):
        assert profiling.main([*table, "--trace", str(bad)]) == 2
        assert "--trace" in capsys.readouterr().err
    assert readme.read_text() == "# keep me\n"
    assert not (tmp_path / "t.json").exists()  # refused before the run
    trace = tmp_path / "trace.json"
    trace.write_text('{\n  "schemaVersion": 1, "traceEvents": []}')
    assert profiling.TRACE_KIND(trace) and not profiling.TRACE_KIND(readme)


def test_short_name_keeps_what_an_eager_kernel_does():
    name = "void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float>"
    assert profiling.short_name(name, 40) == "cunn_SoftMaxBackward<4, float, float,..."
    assert profiling.short_name("void at::native::vectorized_elementwise_kernel<4>") == (
        "vectorized_elementwise_kernel<4>"
    )
    assert profiling.short_name("nvjet_sm90_tst_256x128", 70) == "nvjet_sm90_tst_256x128"


def test_launchers_markdown_renders_the_committed_h100_run():
    from helpers.measure import results

    data = results.load(profiling.LAUNCHERS_RESULT)
    assert data is not None and data["device"].startswith("NVIDIA H100")
    rows = data["rows"][0]["profile"]["launchers"]
    table = profiling.launchers_markdown(rows).splitlines()
    assert len(table) == 2 + 5  # header, delimiter, five rows
    assert table[2].startswith("| `reduce_kernel<") and "| 0.451 | 62 |" in table[2]
    assert "`aten::sum` <- `CompiledFunctionBackward`" in table[2]
    assert "[[1024, 768], [], [], []]" in table[2]
    assert "`aten::sum` <- `fastgpt2::qkv_grad_cat_opaque`" in table[4]
