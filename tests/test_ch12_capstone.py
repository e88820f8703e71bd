"""Tests for helpers/chapters/ch12_capstone.py (chapter 12): checklist, comparison, budget,
published figures, explorer."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest
import torch

from helpers.chapters import ch12_capstone as capstone
from helpers.core.model import GPT, GPTConfig
from helpers.measure import results

SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"
BASE = dict(
    matmul_precision="fp32",
    autocast=None,
    compile=None,
    attention="manual",
    vocab_multiple=1,
    optimizer="foreach",
    batch_size=4,
    seq_len=64,
    grad_accum_steps=1,
    grad_clip=1.0,
    lr=6e-4,
    weight_decay=0.1,
    betas=[0.9, 0.95],
    seed=1,
)


def _row(name, status="measured", ms=None, spread=1.0, reason=None, **switches):
    sw = {**BASE, **switches}
    return {
        "name": name,
        "status": status,
        "ms_per_step": ms,
        "tokens_per_s": None if ms is None else 256_000 / ms,
        "speedup": None,
        "mfu": None,
        "peak_mem_bytes": None,
        "first_step_ms": None if ms is None else 3 * ms,
        "loss": None,
        "reason": reason or ("ok" if status == "measured" else "cannot run here"),
        "spread_pct": spread,
        "switches": sw,
    }


def _results(rows, device="cpu (synthetic)"):
    first = next(r["ms_per_step"] for r in rows if r["status"] == "measured")
    for r in rows:
        if r["status"] == "measured":
            r["speedup"] = first / r["ms_per_step"]
    return {
        "device": device,
        "torch": "x",
        "date": "2026-01-01",
        "rungs": rows,
        "config": {
            "batch_size": 4,
            "seq_len": 64,
            "model": dict(block_size=64, n_layer=1, n_head=2, n_embd=32),
        },
    }


def synthetic():
    """A CPU-like ladder: tf32 skipped (not carried), a slower rung, a rung within noise,
    an unknown new switch."""
    return _results(
        [
            _row("fp32", ms=100.0),
            _row(
                "+ tf32",
                status="skipped",
                reason="TF32 needs compute capability >= 8.0",
                matmul_precision="tf32",
            ),
            _row("+ bf16 autocast", ms=50.0, autocast="bf16"),
            _row("+ torch.compile", ms=60.0, autocast="bf16", compile="default"),
            _row("+ sdpa attention", ms=59.0, autocast="bf16", compile="default", attention="sdpa"),
            _row(
                "+ new thing",
                ms=40.0,
                autocast="bf16",
                compile="default",
                attention="sdpa",
                new_switch=True,
            ),
        ]
    )


@pytest.fixture(scope="module")
def h200():
    res = results.load("h200-ladder-b16.json")
    assert res is not None, "the committed H200 ladder is part of the repository"
    return res


@pytest.fixture(scope="module")
def published():
    pub = results.load(capstone.PUBLISHED_FILE)
    assert pub is not None, f"results/{capstone.PUBLISHED_FILE} is part of the repository"
    return pub


# ---- reading rows --------------------------------------------------------------------------------


def test_rung_changes_come_from_the_rows_and_skip_what_did_not_run():
    ch = capstone.rung_changes(synthetic())
    assert ch[0] == {} and ch[1] == {"matmul_precision": "tf32"}
    assert ch[2] == {
        "autocast": "bf16"
    }  # tf32 was skipped, so it is not part of the next rung's change
    assert ch[3] == {"compile": "default"} and ch[5] == {"new_switch": True}


def test_fastest_rung_is_the_last_measured_and_none_measured_is_an_error():
    res = synthetic()
    res["rungs"].append(
        _row("+ broken", status="failed", reason="RuntimeError: boom", optimizer="fused")
    )
    assert capstone.fastest_rung(res)["name"] == "+ new thing"
    for r in res["rungs"]:
        r["status"] = "skipped"
    with pytest.raises(ValueError, match="nothing to train"):
        capstone.fastest_rung(res)


def test_run_config_and_model_config_round_trip_the_committed_row(h200):
    row = capstone.fastest_rung(h200)
    run = capstone.run_config_of(row)
    assert run.name == row["name"] and run.betas == (0.9, 0.95) and isinstance(run.betas, tuple)
    assert (run.autocast, run.compile, run.attention, run.vocab_multiple) == (
        "bf16",
        "default",
        "sdpa",
        64,
    )
    assert capstone.model_config_of(h200) == GPTConfig()


# ---- checklist -----------------------------------------------------------------------------------


def test_checklist_from_synthetic_rows():
    items = capstone.checklist(synthetic())
    assert [i["optimisation"] for i in items] == [
        "+ tf32",
        "+ bf16 autocast",
        "+ torch.compile",
        "+ sdpa attention",
        "+ new thing",
    ]
    by = {i["optimisation"]: i for i in items}
    assert by["+ tf32"]["gain"] is None and by["+ tf32"]["verdict"] == "not run here"
    assert "compute capability" in by["+ tf32"]["skipped_reason"] and "8.0" in by["+ tf32"]["when"]
    # bf16 is compared with fp32 (the last measured rung), not with the skipped tf32
    assert by["+ bf16 autocast"]["compared_with"] == "fp32" and by["+ bf16 autocast"][
        "gain"
    ] == pytest.approx(2.0)
    assert by["+ bf16 autocast"]["verdict"].startswith("faster here")
    assert by["+ torch.compile"]["gain"] == pytest.approx(50 / 60) and by["+ torch.compile"][
        "verdict"
    ].startswith("slower here")
    assert by["+ sdpa attention"]["verdict"].startswith("no clear gain")  # 60 -> 59 ms is within 3%
    assert by["+ new thing"]["when"].startswith("no advice written for switch 'new_switch'")
    assert by["+ bf16 autocast"]["when"] == capstone.WHEN_TO_USE[("autocast", "bf16")]
    assert by["+ torch.compile"]["when"] == capstone.WHEN_TO_USE["compile"]
    text = capstone.format_checklist(items)
    assert "why not: TF32 needs" in text and text.count("when:") == 5
    assert "no clear gain here: 1.02x, inside the 3% spread" in text  # 60 -> 59 ms: no "slower"



def test_checklist_noise_uses_the_measured_spread():
    res = synthetic()
    res["rungs"][2]["spread_pct"] = 30.0  # bf16 rung: 2x faster is still beyond 30% noise
    res["rungs"][3]["spread_pct"] = 30.0  # compile rung: 1.2x slower is now within the noise
    by = {i["optimisation"]: i for i in capstone.checklist(res)}
    assert by["+ bf16 autocast"]["verdict"].startswith("faster here")
    assert (
        by["+ torch.compile"]["verdict"].startswith("no clear gain")
        and "slower, 0.83x, inside the 30% spread" in by["+ torch.compile"]["verdict"]
    )


def test_checklist_of_the_committed_h200_ladder(h200):
    items = capstone.checklist(h200)
    assert len(items) == len(h200["rungs"]) - 1
    rows = h200["rungs"]
    assert all(i["status"] == "measured" and i["skipped_reason"] is None for i in items)
    for prev, row, item in zip(rows[:-1], rows[1:], items, strict=True):
        assert item["gain"] == pytest.approx(prev["ms_per_step"] / row["ms_per_step"])
    # the gains multiply to the whole ladder's speed-up
    assert math.prod(i["gain"] for i in items) == pytest.approx(
        rows[0]["ms_per_step"] / rows[-1]["ms_per_step"]
    )
    tf32 = next(i for i in items if i["switches"] == {"matmul_precision": "tf32"})
    assert tf32["verdict"].startswith("faster here") and "compute capability >= 8.0" in tf32["when"]


def test_failed_rung_is_reported_and_the_next_compares_with_the_last_measured():
    res = synthetic()
    res["rungs"].insert(
        3,
        _row(
            "+ fused AdamW",
            status="failed",
            reason="RuntimeError: boom",
            autocast="bf16",
            optimizer="fused",
        ),
    )
    for r in res["rungs"][4:]:
        r["switches"]["optimizer"] = "fused"  # a failed rung is still carried (it could run here)
    by = {i["optimisation"]: i for i in capstone.checklist(res)}
    assert (
        by["+ fused AdamW"]["verdict"] == "failed here"
        and by["+ fused AdamW"]["skipped_reason"] == "RuntimeError: boom"
    )
    assert by["+ torch.compile"]["compared_with"] == "+ bf16 autocast" and by["+ torch.compile"][
        "switches"
    ] == {"compile": "default"}


# ---- time budget ---------------------------------------------------------------------------------


def test_steps_for_budget():
    assert capstone.steps_for_budget(50.0, 10.0) == 200
    assert (
        capstone.steps_for_budget(50.0, 10.0, first_step_ms=5050.0) == 100
    )  # 5050 + 99 * 50 ms = 10 s
    assert (
        capstone.steps_for_budget(50.0, 10.0, first_step_ms=10.0) == 200
    )  # a fast first step costs nothing extra
    assert capstone.steps_for_budget(50.0, 10.0, max_steps=30) == 30
    assert capstone.steps_for_budget(5000.0, 1.0, min_steps=20) == 20
    assert (
        capstone.steps_for_budget(
            33.745, 100.0, first_step_ms=1475.2, min_steps=100, max_steps=3000
        )
        == 2920
    )


@pytest.mark.parametrize("args", [(0.0, 10.0), (-1.0, 10.0), (50.0, 0.0), (float("nan"), 1.0)])
def test_steps_for_budget_refuses_nonsense(args):
    with pytest.raises(ValueError, match="step_ms > 0"):
        capstone.steps_for_budget(*args)
    with pytest.raises(ValueError, match="min_steps"):
        capstone.steps_for_budget(50.0, 10.0, min_steps=10, max_steps=5)


def test_budgets_and_ladder_settings_per_device():
    assert capstone.ladder_settings("cpu") == {"warmup": 1, "iters": 2}
    assert capstone.ladder_settings(torch.device("cuda")) == {"warmup": 3, "iters": 10}
    cpu, gpu = capstone.training_budget("cpu"), capstone.training_budget("cuda")
    assert 20 <= cpu["min_steps"] <= cpu["max_steps"] <= 40 and gpu["budget_s"] > cpu["budget_s"]


# ---- published figures ---------------------------------------------------------------------------


def test_published_figures_schema_and_sources(published):
    assert capstone.published_problems(published) == []
    assert published["kind"] == "published"
    for src in published["sources"].values():
        assert set(src) >= {"file", "title", "author", "url", "provenance_note"}
        assert re.fullmatch(r"\d{3}_[0-9a-f]{16}\.txt", src["file"])
    assert set(published["gpus"]) == {"A100", "T4"}
    stages = {s["id"]: s for s in published["stages"]}
    assert stages["fp32"]["ms_per_step"] == {"A100": 1040, "T4": 1100}
    assert stages["all"]["requires"] == "last" and stages["all"]["ms_per_step"]["A100"] == 100


def test_published_problems_catches_bad_files(published):
    cases = {
        "kind": lambda p: p.__setitem__("kind", "measured"),
        "lacks the field 'url'": lambda p: next(iter(p["sources"].values())).pop("url"),
        "without a note": lambda p: next(iter(p["sources"].values())).pop("provenance_note"),
        "unknown source": lambda p: p["stages"][0].__setitem__("source", "blog"),
        "must be > 0": lambda p: p["stages"][0]["ms_per_step"].__setitem__("A100", -3),
        "requires must be": lambda p: p["stages"][1].__setitem__("requires", ["bf16"]),
    }
    for expected, mutate in cases.items():
        bad = copy.deepcopy(published)
        mutate(bad)
        assert any(expected in p for p in capstone.published_problems(bad)), expected


@pytest.mark.skipif(not SEEDS.is_dir(), reason="the seed articles are not next to this checkout")
def test_every_published_step_time_appears_in_its_seed_article(published):
    for st in published["stages"]:
        text = (
            (SEEDS / published["sources"][st["source"]]["file"])
            .read_text(encoding="utf-8")
            .replace(",", "")
        )
        for gpu, ms in st["ms_per_step"].items():
            if ms is not None:
                assert f"{ms}ms" in text.replace(" ", "") or f"| {ms} |" in text, (
                    st["id"],
                    gpu,
                    ms,
                )
        for ms in (st.get("first_step_ms") or {}).values():
            assert str(ms) in text


# ---- comparison ----------------------------------------------------------------------------------


def test_comparison_keeps_published_and_measured_apart(published, h200):
    measured = {"H200 B=16": h200, "here": synthetic()}
    rows = capstone.comparison_rows(measured, published)
    assert [r["stage"] for r in rows] == [s["label"] for s in published["stages"]]
    for r, st in zip(rows, published["stages"], strict=True):
        assert set(r["published"]) == set(published["gpus"]) and set(r["measured"]) == set(measured)
        for g, v in r["published"].items():
            assert (v is None) == (st["ms_per_step"].get(g) is None)
            if v is not None:
                assert v["ms"] == st["ms_per_step"][g] and "rung" not in v
        for v in r["measured"].values():
            assert v is None or v["rung"]  # every measured cell names the rung it was measured on
    by = {r["stage"]: r for r in rows}
    assert by["+ torch.compile"]["measured"]["H200 B=16"]["ms"] == next(
        x["ms_per_step"] for x in h200["rungs"] if x["name"] == "+ torch.compile"
    )
    assert by["+ mixed precision"]["measured"]["here"]["rung"] == "+ bf16 autocast"
    assert by["all optimisations"]["measured"]["here"]["rung"] == "+ new thing"
    text = capstone.format_comparison(rows, published, measured)
    header = text.splitlines()[1]
    assert (
        "A100 published" in header and "T4 published" in header and "H200 B=16 measured" in header
    )
    assert header.count("published") == len(published["gpus"]) and header.count("measured") == len(
        measured
    )
    assert "author: not given" in text and "A100 40GB" in text
    assert "000_63ed5926dca728c8.txt" not in text and "shared/" not in text  # not in the repo


def test_matching_rung_requirements():
    res = synthetic()
    assert capstone.matching_rung(res, {})["name"] == "fp32"
    assert capstone.matching_rung(res, "last")["name"] == "+ new thing"
    assert capstone.matching_rung(res, {"compile": "on"})["name"] == "+ torch.compile"
    assert (
        capstone.matching_rung(res, {"matmul_precision": ["tf32"]}) is None
    )  # skipped rungs never match
    with pytest.raises(ValueError, match="published"):
        capstone.comparison_rows({"x": res}, None)


# ---- explorer ------------------------------------------------------------------------------------


def test_describe_selection(h200):
    n = len(h200["rungs"]) - 1
    last = h200["rungs"][-1]
    text = capstone.describe_selection(h200, [True] * n)
    assert f"{last['ms_per_step']:.1f} ms/step" in text and "NVIDIA H200" in text
    assert f"{h200['rungs'][0]['ms_per_step']:.1f} ms/step" in capstone.describe_selection(
        h200, [False] * n
    )
    gap = [False] * n
    gap[2] = True
    assert "not measured" in capstone.describe_selection(h200, gap)
    res = synthetic()
    assert "could not run" in capstone.describe_selection(res, [True, True, False, False, False])
    assert "50.0 ms/step" in capstone.describe_selection(
        res, [False, True, False, False, False]
    )  # skipped rung may stay off
    with pytest.raises(ValueError, match="one per rung"):
        capstone.describe_selection(res, [True])


def test_explorer_has_one_checkbox_per_optimisation(h200):
    w = capstone.explorer({"H200 B=16": h200, "synthetic": synthetic()})
    pick, boxes, _ = w.children
    assert [b.description for b in boxes.children] == [r["name"] for r in h200["rungs"][1:]]
    pick.value = "synthetic"
    assert [b.value for b in boxes.children] == [
        False,
        True,
        True,
        True,
        True,
    ]  # the skipped rung starts off


def test_ladder_figure_has_four_panels(h200):
    import matplotlib

    matplotlib.use("Agg")
    fig = capstone.ladder_figure(synthetic())
    assert len(fig.axes) == 4 and "synthetic" in fig._suptitle.get_text()
    import matplotlib.pyplot as plt

    plt.close(fig)


# ---- sampling ------------------------------------------------------------------------------------


def test_sample_text_is_seeded_and_decodes_from_a_padded_model():
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=32, vocab_multiple=64))
    a = capstone.sample_text(m, "ROMEO:", 8, seed=3)
    assert a.startswith("ROMEO:") and a == capstone.sample_text(m, "ROMEO:", 8, seed=3)
    assert a != capstone.sample_text(m, "ROMEO:", 8, seed=4)


def test_published_json_is_valid_json_with_no_measured_fields():
    pub = json.loads((results.results_dir() / capstone.PUBLISHED_FILE).read_text())
    assert "rungs" not in pub  # cannot be mistaken for a measured ladder


def test_checklist_of_a_committed_result_names_its_device():
    items = capstone.checklist(synthetic(), where="on the H200")
    assert all("here" not in i["verdict"] for i in items)
    assert any(i["verdict"].startswith("faster on the H200") for i in items)


def test_comparison_markdown_is_the_text_tables_cells_as_a_real_table(published, h200):
    measured = {"H200 B=16": h200, "here": synthetic()}
    rows = capstone.comparison_rows(measured, published)
    text = capstone.format_comparison(rows, published, measured)
    md = capstone.comparison_markdown(rows, published, measured).splitlines()
    head = md.index(
        "| stage | A100 published | T4 published | H200 B=16 measured | here measured |"
    )
    assert md[head + 1] == "|---|---:|---:|---:|---:|"
    text_rows = text.splitlines()[3 : 3 + len(rows)]
    md_rows = md[head + 2 : head + 2 + len(rows)]
    for text_row, md_row in zip(text_rows, md_rows, strict=True):
        # the same cells: the text's columns are 2+ spaces apart, the Markdown's " | " apart
        assert re.split(r"\s{2,}", text_row.strip()) == md_row.strip("| ").split(" | ")
    assert "- seed-000: " in "\n".join(md) and "**measured:**" in md


def test_selection_markdown_draws_the_explorers_opening_state(h200):
    w = capstone.explorer({"H200 B=16": h200})
    _, boxes, _ = w.children
    ticked = capstone.default_selection(h200)
    assert [b.value for b in boxes.children] == ticked
    md = capstone.selection_markdown(h200, ticked)
    last = h200["rungs"][-1]
    assert md.startswith(f"**{h200['device']}, B={h200['config']['batch_size']}")
    # one box per widget box; the first rung has none in the widget, so none here either
    assert md.count("| \u2611 |") == sum(ticked) and "\u2610" not in md
    first = h200["rungs"][0]
    assert f"| base | `{first['name']}` | {first['ms_per_step']:.1f} | 1.00x |" in md
    assert f"| `{last['name']}` | {last['ms_per_step']:.1f} | {last['speedup']:.2f}x |" in md
    assert f"**measured:** {last['ms_per_step']:.1f} ms/step" in md
    gap = [n in ("+ tf32", "+ torch.compile") for n in (r["name"] for r in h200["rungs"][1:])]
    md = capstone.selection_markdown(h200, gap)
    assert md.count("| \u2611 |") == 2 and "not measured: the ladder adds switches" in md
    with pytest.raises(ValueError, match="one per rung"):
        capstone.selection_markdown(h200, [True])


def test_comparison_names_the_rungs_a_cumulative_row_also_includes(published, h200):
    # The ladder is cumulative: its "+ mixed precision" row comes after "+ tf32", so that speed-up
    # includes TF32's; the source lines must say so next to the A100's mixed-precision-only row.
    rows = capstone.comparison_rows({"H200 B=16": h200}, published)
    md = capstone.comparison_markdown(rows, published, {"H200 B=16": h200})
    assert "+ mixed precision = + bf16 autocast (after + tf32)" in md
    assert "FP32 baseline = fp32," in md and "= + torch.compile," in md  # nothing in between
    assert f"all optimisations = {h200['rungs'][-1]['name']} (the last rung of that run)" in md
    assert "T=not stated, B=not stated" in md  # the published step times state neither


def test_checklist_names_start_in_one_column_past_nine_items(h200):
    text = capstone.format_checklist(capstone.checklist(h200))
    heads = [line for line in text.splitlines() if line.startswith("[")]
    assert len(heads) >= 10 and len({line.index("+") for line in heads}) == 1
