"""Tests for helpers/chapters/ch05_compile.py (CPU only; no timing is asserted)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from helpers.chapters import ch05_compile as compilation
from helpers.core import train
from helpers.core.model import GPTConfig
from helpers.measure import hardware, results

TINY = GPTConfig(block_size=16, vocab_size=256, n_layer=1, n_head=2, n_embd=32)
needs_compile = pytest.mark.skipif(
    not hardware.compile_support(torch.device("cpu"))[0], reason="no C++ compiler for inductor"
)


def _tiny_run(**changes) -> train.RunConfig:
    return train.RunConfig(name="tiny", batch_size=2, seq_len=16, **changes)


def _tokens() -> torch.Tensor:
    return torch.randint(0, TINY.vocab_size, (4096,), generator=torch.Generator().manual_seed(0))


def _raising_backend(gm, example_inputs):
    raise RuntimeError("simulated compiler failure")


def test_eager_gelu_launches_one_kernel_per_op_and_hand_written_gelu_one():
    x = torch.randn(64, 128)
    eager = compilation.count_kernels(compilation.gelu_tanh_unfused, x, "cpu")
    assert eager["kernels"] == 8 and all(n.startswith("aten::") for n in eager["names"])
    assert compilation.count_kernels(torch.nn.GELU(approximate="tanh"), x, "cpu")["names"] == [
        "aten::gelu"
    ]


def test_kernel_count_excludes_views_and_allocations():
    out = compilation.count_kernels(
        lambda x: x.view(-1).reshape(8, 16).t() + 1.0, torch.randn(16, 8), "cpu"
    )
    assert out["names"] == ["aten::add"]


@needs_compile
def test_compiled_gelu_is_one_generated_kernel_with_the_same_result():
    torch._dynamo.reset()
    fused = torch.compile(compilation.gelu_tanh_unfused)
    x = torch.randn(64, 128)
    counted = compilation.count_kernels(fused, x, "cpu")
    assert counted["kernels"] == 1 and "cpp_fused" in counted["names"][0]
    torch.testing.assert_close(
        fused(x), torch.nn.functional.gelu(x, approximate="tanh"), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize(
    "args,want",
    [
        ((33.4, 144.1, 49.7), 354),
        ((10.0, 80.0, 50.0), 334),
        ((0.01, 100.0, 20.0), 1),
        ((0.0, 40.0, 30.0), 0),
        ((30.0, 2400.0, 2600.0), math.inf),
        ((5.0, 40.0, 40.0), math.inf),
    ],
)
def test_break_even_rounds_up_and_says_never_when_compiled_is_not_faster(args, want):
    assert compilation.break_even_steps(*args) == want


def test_break_even_rejects_negative_times():
    with pytest.raises(ValueError, match=">= 0"):
        compilation.break_even_steps(-1.0, 10.0, 5.0)


def test_a_failing_compile_is_measured_and_labelled_eager():
    row = compilation.measure_step(
        _tiny_run(compile="default"),
        TINY,
        "cpu",
        _tokens(),
        iters=1,
        warmup=0,
        backend=_raising_backend,
    )
    assert row["status"] == "measured" and row["ms_per_step"] > 0
    assert row["compiled"] is False and row["label"] == "eager" and row["compile_s"] is None
    assert "BackendCompilerFailed" in row["reason"] and "eager" in row["reason"]
    line = compilation.format_rows([row]).splitlines()[1]
    assert line.split()[:2] == ["default", "eager"] and "fell back to eager" in line


def test_compile_unavailable_measures_eager_and_says_why(monkeypatch):
    monkeypatch.setattr(
        hardware, "compile_support", lambda device: (False, "no C++ compiler on PATH")
    )
    row = compilation.measure_step(
        _tiny_run(compile="default"), TINY, "cpu", _tokens(), iters=1, warmup=0
    )
    assert row["status"] == "measured" and not row["compiled"] and row["label"] == "eager"
    assert "no C++ compiler on PATH" in row["reason"]


def test_reduce_overhead_is_skipped_on_cpu_with_the_reason():
    row = compilation.measure_step(_tiny_run(compile="reduce-overhead"), TINY, "cpu", _tokens())
    assert row["status"] == "skipped" and row["ms_per_step"] is None and "CUDA" in row["reason"]
    assert "skipped: " in compilation.format_rows([row])


@needs_compile
def test_a_real_compile_is_labelled_compiled_and_does_not_recompile_in_steady_steps():
    row = compilation.measure_step(
        _tiny_run(compile="default"), TINY, "cpu", _tokens(), iters=2, warmup=1
    )
    assert row["compiled"] and row["label"] == "default" and row["reason"] == "compiled"
    assert row["graphs"] >= 1 and row["graphs_after_first_step"] == 0
    assert row["compile_s"] is not None


def test_eager_run_has_no_compile_time():
    row = compilation.measure_step(_tiny_run(), TINY, "cpu", _tokens(), iters=1, warmup=0)
    assert (
        row["mode"] == "eager"
        and not row["compiled"]
        and row["compile_s"] is None
        and row["graphs"] == 0
    )


@needs_compile
def test_watch_compiles_sees_a_new_shape_and_a_changed_python_scalar():
    torch._dynamo.reset()

    def scaled(x, scale):
        return scale * torch.tanh(x)

    f = torch.compile(scaled)
    rows = compilation.watch_compiles(
        [
            ("first", lambda: f(torch.randn(4, 8), 2.0)),
            ("same", lambda: f(torch.randn(4, 8), 2.0)),
            ("new shape", lambda: f(torch.randn(4, 16), 2.0)),
            ("new scalar", lambda: f(torch.randn(4, 16), 3.0)),
        ]
    )
    assert [r["new_graphs"] for r in rows] == [1, 0, 1, 1]
    assert rows[1]["ran"] == "reused a graph"
    # torch >= 2.5 names the size; torch 2.4 the stride that changed with it (both seen, 2026-11-29)
    assert ("size" in rows[2]["reason"] or "stride" in rows[2]["reason"]) and "scale" in rows[3][
        "reason"
    ]


@needs_compile
@pytest.mark.skipif(
    tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (2, 5),
    reason=(
        "torch 2.4 compiled all three modules (measured with 2.4.1 on a CPU, 2026-11-29): "
        "the modules did not share one recompile budget there; chapter 05 says so"
    ),
)
def test_watch_compiles_reports_eager_past_the_recompile_limit():
    torch._dynamo.reset()
    lin = [torch.nn.Linear(8, w) for w in (4, 6, 10)]
    with torch._dynamo.config.patch({compilation.recompile_limit_key(): 2}):
        rows = compilation.watch_compiles(
            [(f"w{m.out_features}", lambda m=m: torch.compile(m)(torch.randn(2, 8))) for m in lin]
        )
    torch._dynamo.reset()
    assert [r["new_graphs"] for r in rows] == [1, 1, 0]
    assert rows[2]["ran"].startswith("eager")


def test_cold_compile_cache_is_a_fresh_folder_removed_afterwards():
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with compilation.cold_compile_cache():
        inside = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        assert inside != before and os.path.isdir(inside) and not os.listdir(inside)
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before and not os.path.exists(inside)


def test_chapter_run_is_the_pre_compile_rung_on_cpu():
    run = compilation.chapter_run("cpu", "default")
    _, B, T = train.default_shapes("cpu")
    assert (run.batch_size, run.seq_len, run.compile, run.matmul_precision, run.autocast) == (
        B,
        T,
        "default",
        "fp32",
        None,
    )


def test_rows_markdown_has_the_text_tables_cells():
    rows = results.load("h200-compile-modes.json")["rows"]
    text = compilation.format_rows(rows).splitlines()[1:]
    md = compilation.rows_markdown(rows).splitlines()
    assert md[:2] == [
        "| mode | ran as | first step (s) | step (ms) | compile (s) | note |",
        "|---|---|---:|---:|---:|---|",
    ]
    for text_row, md_row in zip(text, md[2:], strict=True):
        assert (
            text_row.split() == " ".join(md_row.strip("| ").split(" | ")).replace("`", "").split()
        )


def test_watch_markdown_shows_the_failed_guard_as_code_and_can_leave_it_out():
    rows = [
        {
            "label": "x (8, 512): new shape",
            "new_graphs": 1,
            "ran": "compiled new graph",
            "reason": "tensor 'x' size mismatch at index 1",
        },
        {"label": "same shape", "new_graphs": 0, "ran": "reused a graph", "reason": ""},
    ]
    md = compilation.watch_markdown(rows).splitlines()
    assert md[0] == "| call | new graphs | ran | guard that failed |"
    assert md[2] == (
        "| x (8, 512): new shape | 1 | compiled new graph | `tensor 'x' size mismatch at index 1` |"
    )
    assert md[3] == "| same shape | 0 | reused a graph |  |"
    assert compilation.watch_markdown(rows, reasons=False).splitlines()[0] == (
        "| call | new graphs | ran |"
    )
