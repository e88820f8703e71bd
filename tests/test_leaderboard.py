"""Tests for helpers/grading/leaderboard.py: the committed H200 ladders as two learners'
submissions, made-up learners, and tampered, copied, emulated, broken, linked and huge files."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import nbformat
import pytest

from helpers import REPO_ROOT
from helpers.grading import leaderboard
from helpers.grading.grader import main

RESULTS = REPO_ROOT / "results"
FILE = leaderboard.SUBMISSION_FILE


def ladder(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def scaled(record: dict, factor: float, fp32_factor: float | None = None) -> dict:
    """A made-up ladder: every measured rung ``factor`` times slower (the fp32 rung
    ``fp32_factor`` times), with tokens/s and speed-ups recomputed so that it stays consistent."""
    out = copy.deepcopy(record)
    measured = [r for r in out["rungs"] if r["status"] == "measured"]
    for r in measured:
        f = fp32_factor if r["name"] == "fp32" and fp32_factor is not None else factor
        r["ms_per_step"] *= f
        r["tokens_per_s"] /= f
    for r in measured:
        r["speedup"] = measured[0]["ms_per_step"] / r["ms_per_step"]
    return out


def submit(root: Path, student: str, content: dict | str) -> Path:
    path = root / student / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def by_student(rows: list[dict]) -> dict[str, dict]:
    return {r["student"]: r for r in rows}


def test_the_committed_h200_ladders_are_valid_and_fully_checked():
    for name in ("h200-ladder-b16.json", "h200-ladder-b64.json"):
        assert leaderboard.validate(ladder(name)) == [], name
        assert leaderboard.unchecked(ladder(name)) == [], name
        assert leaderboard.gpu_model(ladder(name)) == "H200"


@pytest.fixture
def classroom(tmp_path: Path) -> Path:
    """Two real learners (the committed H200 ladders), made-up ones, and every kind of fake."""
    subs = tmp_path / "submissions"
    b16 = ladder("h200-ladder-b16.json")
    submit(subs, "alice", b16)
    submit(subs, "bob", ladder("h200-ladder-b64.json"))
    # slower overall but from a slower fp32 rung: last by tokens/s, first by speed-up
    submit(subs, "carol", scaled(b16, 1.1, fp32_factor=2.0))
    dave = submit(subs, "dave", scaled(b16, 1.3))
    submit(subs, "copycat", dave.read_text())
    tampered = scaled(b16, 1.05)  # its own timings: a tampered copy of alice's is a copy
    tampered["rungs"][-1]["tokens_per_s"] *= 1.5
    submit(subs, "tampered", tampered)
    edited = scaled(b16, 1.2)
    edited["rungs"][-1]["speedup"] = 20.0
    submit(subs, "edited-speedup", edited)
    no_torch = scaled(b16, 1.4)
    del no_torch["torch"]
    submit(subs, "no-torch", no_torch)
    submit(subs, "impossible", scaled(b16, 1 / 5))  # 2.8 M tokens/s: 2,400 TFLOP/s
    submit(subs, "emulated", ladder("h200-emulated-t4-ladder-b16.json"))
    submit(subs, "malformed", '{"device": "NVIDIA H200", "rungs": [')
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(scaled(b16, 1.5)))
    (subs / "linked").mkdir()
    (subs / "linked" / FILE).symlink_to(outside)
    with open(submit(subs, "huge", ""), "wb") as f:
        f.truncate(leaderboard.MAX_BYTES + 1)
    (subs / "nothing").mkdir()
    return subs


REFUSED = {
    "tampered": "+ fp8 LM head: tokens_per_s 805,583 is not B*T/(ms/1000) = 537,055",
    "edited-speedup": "speedup 20.000x is not the first measured rung's",
    "no-torch": "provenance: no 'torch' recorded",
    "impossible": "faster than possible",
    "dave": "identical rung timings to copycat's submission",
    "copycat": "identical rung timings to dave's submission",
    "emulated": "emulated GPU (NVIDIA H200 emulating T4)",
    "malformed": "is not valid JSON",
    "linked": "outside the submissions folder: not read",
    "huge": "has 1,048,577 bytes, over 1,048,576: not read",
    "nothing": f"no {FILE} submitted",
}


def test_each_fake_is_refused_with_its_reason_and_never_ranked(classroom: Path):
    rows = leaderboard.rank(leaderboard.collect(classroom))
    ranked = [r["student"] for r in rows if r["status"] == "ranked"]
    assert ranked == ["bob", "alice", "carol"]  # by best tokens/s
    got = by_student(rows)
    assert set(got) == {"alice", "bob", "carol", *REFUSED}
    for student, reason in REFUSED.items():
        row = got[student]
        assert row["status"] == "refused" and reason in row["reasons"], (student, row["reasons"])
        assert row["rank_tokens_per_s"] == row["rank_speedup"] == row["best_tokens_per_s"] == ""
    assert got["tampered"]["reasons"].count(";") == 0  # only the tampered rung is blamed
    assert "peak check not possible" not in got["emulated"]["reasons"]  # refused for emulation
    assert got["impossible"]["reasons"].startswith("+ torch.compile: ")  # its first rung over
    assert (got["bob"]["best_tokens_per_s"], got["alice"]["best_tokens_per_s"]) == (611389, 563908)
    assert [got[s]["rank_speedup"] for s in ("carol", "bob", "alice")] == [1, 2, 3]
    assert got["alice"]["speedup_over_fp32"] == 12.62 and got["bob"]["best_rung"] == "+ fp8 LM head"


def test_the_peak_check_uses_the_datasheet_and_twice_it_only_for_the_fp8_rung():
    b16 = ladder("h200-ladder-b16.json")
    # 1.75x faster: the fastest bf16 rung's 936k tokens/s are 800 TFLOP/s (under 989.4); 2.2x
    # faster: the last three bf16 rungs reach 1,002-1,006 TFLOP/s, the fp8 rung 1,061 (under 2x)
    assert leaderboard.validate(scaled(b16, 1 / 1.75)) == []
    problems = leaderboard.validate(scaled(b16, 1 / 2.2))
    over = ["+ Triton CE", "+ clip in AdamW", "+ fused LM-head CE"]
    assert [p.split(":")[0] for p in problems] == over
    assert "989.4 TFLOP/s datasheet peak of the NVIDIA H200 SXM" in problems[0]
    # the fp8 allowance follows any fp8 switch, and only an fp8 switch
    fast = scaled(b16, 1 / 2.2)
    fp8_rung = fast["rungs"][-1]["switches"]
    fp8_rung.update(lm_head_fp8=False, mlp_fp8=True)
    assert [p.split(":")[0] for p in leaderboard.validate(fast)] == over
    fp8_rung.update(mlp_fp8=False)
    assert [p.split(":")[0] for p in leaderboard.validate(fast)] == [*over, "+ fp8 LM head"]
    # a claimed fp8 switch earns nothing without bf16 autocast or on a GPU without fp8 tensor cores
    fp8_rung.update(mlp_fp8=True, autocast=None)
    assert [p.split(":")[0] for p in leaderboard.validate(fast)] == [*over, "+ fp8 LM head"]
    fp8_rung.update(autocast="bf16")
    # the H200's own fp8 rung, 482 TFLOP/s: over an A100's 312 bf16 peak, under twice it
    a100 = {**scaled(b16, 1.0), "device": "NVIDIA A100-SXM4-80GB"}
    a100["rungs"][-1]["switches"].update(mlp_fp8=True)
    assert "+ fp8 LM head" in [p.split(":")[0] for p in leaderboard.validate(a100)]
    h200 = scaled(b16, 1.0)
    h200["rungs"][-1]["switches"].update(mlp_fp8=True)
    assert "+ fp8 LM head" not in [p.split(":")[0] for p in leaderboard.validate(h200)]


def test_a_lowered_flops_per_token_cannot_slip_under_the_peak():
    fake = scaled(ladder("h200-ladder-b16.json"), 1 / 5)
    fake["config"]["flops_per_token"] //= 4
    problems = leaderboard.validate(fake)
    assert any("is not the recorded model's 855,166,464 at T=1024" in p for p in problems)


def test_an_unknown_gpu_is_ranked_and_says_its_peak_was_not_checked(tmp_path: Path):
    fake = scaled(ladder("h200-ladder-b16.json"), 3.0)
    fake["device"] = "NVIDIA GeForce RTX 4090"
    submit(tmp_path, "fake-learner", fake)
    (row,) = leaderboard.rank(leaderboard.collect(tmp_path))
    assert row["status"] == "ranked" and row["gpu_model"] == "NVIDIA GeForce RTX 4090"
    assert row["reasons"].startswith("peak check not possible: no datasheet peak for")


@pytest.mark.parametrize(
    "break_it, reason",
    [
        (lambda r: r.pop("config"), "config: batch_size and seq_len"),
        (lambda r: r["config"].update(batch_size="16"), "config: batch_size and seq_len"),
        (lambda r: r.update(date="30/11/2026"), "is not an ISO date"),
        (lambda r: r.update(device=""), "provenance: no 'device' recorded"),
        (lambda r: r.update(rungs=[]), "rungs: a non-empty list"),
        (lambda r: r["rungs"][0].update(status="fast"), "each rung needs a name and a status"),
        (lambda r: r["rungs"][2].update(ms_per_step=None), "rungs ['+ bf16 autocast']"),
        (lambda r: r["rungs"][2].update(peak_mem_bytes=-1), "peak_mem_bytes (an int >= 0"),
        (lambda r: r["config"]["model"].pop("n_embd"), "config.model: no GPT-2 shape"),
        (lambda r: [x.update(status="skipped") for x in r["rungs"]], "no measured rung"),
    ],
)
def test_a_ladder_without_its_schema_is_refused(break_it, reason):
    record = ladder("h200-ladder-b16.json")
    break_it(record)
    assert any(reason in p for p in leaderboard.validate(record)), leaderboard.validate(record)
    assert leaderboard.validate([record]) == [
        "not a ladder: the file holds a JSON list, not an object"
    ]


def test_save_writes_what_collect_reads_also_in_nbgraders_layout(tmp_path: Path):
    record = ladder("h200-ladder-b64.json")
    (tmp_path / "erin" / "ch12").mkdir(parents=True)
    leaderboard.save(record, tmp_path / "erin" / "ch12" / FILE)
    (entry,) = leaderboard.collect(tmp_path)
    assert entry.record == record and entry.problems == [] and entry.notes == []


def test_the_command_writes_csv_and_png_and_replaces_only_its_own_without_force(
    classroom: Path, capsys
):
    out = classroom.parent / "board"
    args = [str(classroom), "--csv", str(out / "board.csv"), "--png", str(out / "board.png")]
    assert main(["leaderboard", *args]) == 0
    with open(out / "board.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["student"] for r in rows][:3] == ["bob", "alice", "carol"]
    assert (out / "board.png").read_bytes()[:4] == b"\x89PNG"
    assert "(3 ranked, 11 refused)" in capsys.readouterr().out
    assert main(["leaderboard", *args]) == 0  # its own CSV and PNG: replaced without --force
    capsys.readouterr()

    before = (out / "board.csv").read_text()
    (out / "board.csv").write_text("a teacher's notes")
    assert main(["leaderboard", *args]) == 2  # both files exist: refused before anything is read
    assert "--csv" in capsys.readouterr().err and (out / "board.csv").read_text() != before
    assert main(["leaderboard", *args, "--force"]) == 0
    assert (out / "board.csv").read_text() == before

    inside = [str(classroom), "--csv", str(classroom / "board.csv"), "--png", str(out / "x.png")]
    assert main(["leaderboard", *inside, "--force"]) == 2  # --force does not lift this one
    assert "lies in the submissions folder" in capsys.readouterr().err
    assert not (classroom / "board.csv").exists()
    same = [str(classroom), "--csv", str(out / "a.png"), "--png", str(out / "a.png")]
    assert main(["leaderboard", *same]) == 2
    empty = [str(classroom / "nothing"), "--csv", str(out / "y.csv"), "--png", str(out / "y.png")]
    assert main(["leaderboard", *empty]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == f"error: --csv and --png both name {out / 'a.png'}: give two files"
    assert err[1] == f"error: {classroom / 'nothing'} has no student folders " + (
        f"({classroom / 'nothing'}/<student id>/)"
    )


def test_the_capstone_saves_its_ladder_for_the_leaderboard():
    nb = nbformat.read(REPO_ROOT / "notebooks" / "12_capstone_ladder.ipynb", as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and "leaderboard.save(here)" in c.source]
    assert len(cells) == 1
    (output,) = cells[0].outputs
    assert output.text == f"saved this ladder for the class leaderboard: {FILE}\n"
    assert f"notebooks/{FILE}" in (REPO_ROOT / ".gitignore").read_text().splitlines()


def test_the_committed_example_is_what_the_leaderboard_writes(tmp_path: Path):
    import importlib.util

    script = REPO_ROOT / "benchmarks" / "leaderboard_example.py"
    spec = importlib.util.spec_from_file_location("leaderboard_example", script)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--out-dir", str(tmp_path)]) == 0
    written = (tmp_path / "leaderboard-example.csv").read_text()
    assert written == (RESULTS / "leaderboard-example.csv").read_text()
    assert "course-cpu,ranked" in written and "fake-learner-b,refused" in written


def test_no_leaderboard_cell_a_submission_wrote_is_a_spreadsheet_formula(tmp_path: Path):
    rows = [{c: "" for c in leaderboard.COLUMNS}]
    rows[0].update(student="mallory", device='=HYPERLINK("http://evil.example/","x")')
    rows[0]["torch"] = "@SUM(1)"
    out = tmp_path / "lb.csv"
    leaderboard.write_csv(rows, out)
    row = next(csv.DictReader(out.open()))
    assert all(not str(v).startswith(("=", "@")) for v in row.values()), row
