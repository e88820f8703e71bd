"""Tests for helpers/grading/: the checks, student versions, and grading of submissions."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import notebook_slice
import pytest

from helpers import grading
from helpers.grading import sandbox

FIXTURE = Path(__file__).parent / "fixtures" / "grading_demo.ipynb"
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _chapter_right_answers() -> dict:
    """Right answers, one file per chapter: tests/answers_chNN.py defines RIGHT_ANSWERS for the
    checks of helpers/grading/chNN.py (kept out of the package students install)."""
    import importlib.util

    found = {}
    for path in sorted(Path(__file__).parent.glob("answers_ch*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found.update(module.RIGHT_ANSWERS)
    return found


RIGHT_ANSWERS = _chapter_right_answers()


def test_every_check_has_a_right_answer_wrong_answers_and_a_section():
    assert (
        set(grading.CHECKS)
        == set(RIGHT_ANSWERS)
        == set(grading.WRONG_ANSWERS)
        == set(grading.SECTIONS)
    )
    assert all(grading.WRONG_ANSWERS.values())


@pytest.mark.parametrize("grade_id", sorted(grading.CHECKS))
def test_check_passes_the_right_answer_with_one_pass_line(grade_id, capsys):
    grading.CHECKS[grade_id](RIGHT_ANSWERS[grade_id])
    out = capsys.readouterr().out.strip().splitlines()
    # one message, wrapped at 100 columns: its continuation lines are indented
    assert out[0].startswith(f"PASS {grade_id}:") and all(line.startswith("  ") for line in out[1:])
    assert max(map(len, out)) <= 100


@pytest.mark.parametrize(
    "grade_id,wrong",
    [(gid, fn) for gid, fns in grading.WRONG_ANSWERS.items() for fn in fns],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_check_rejects_wrong_answer_with_a_hint(grade_id, wrong, capsys):
    with pytest.raises(AssertionError) as info:
        grading.CHECKS[grade_id](wrong)
    message = str(info.value)
    assert "Reread chapter" in message, message  # points at the section to reread
    assert "\n" not in message  # the whole hint is the first line the grader reports
    assert "PASS" not in capsys.readouterr().out


def test_block_params_check_measures_the_real_block():
    from helpers.core.model import Block, GPTConfig

    block = Block(GPTConfig(n_embd=64, n_head=4, block_size=8))
    assert grading.ch01.measured_block_parameters(64, 4) == sum(
        p.numel() for p in block.parameters()
    )


@pytest.mark.parametrize(
    "grade_id,wrong,words",
    [
        ("ch00_matmul_flops", grading.ch00._flops_forgot_add, "adds"),
        ("ch00_matmul_flops", grading.ch00._flops_no_return, "return"),
        ("ch00_tflops", grading.ch00._tflops_forgot_ms_to_s, "divide ms by 1e3"),
        ("ch00_tflops", grading.ch00._tflops_forgot_tera, "1e12"),
        ("ch01_loss_at_init", grading.ch01._loss_log10, "natural log"),
        ("ch01_loss_at_init", grading.ch01._loss_log2, "nats"),
        ("ch01_loss_at_init", grading.ch01._loss_probability, "probability"),
        ("ch01_block_params", grading.ch01._block_weights_only, "biases"),
        ("ch01_block_params", grading.ch01._block_forgot_layernorm, "LayerNorm"),
        ("ch04_autocast_step", grading.ch04._step_weights_to_low_precision, "master weights"),
        ("ch04_autocast_step", grading.ch04._step_without_autocast, "torch.autocast"),
        ("ch04_autocast_step", grading.ch04._step_without_zero_grad, "zero_grad"),
        ("ch04_autocast_step", grading.ch04._step_ignores_the_scaler, "GradScaler was not used"),
        ("ch04_autocast_step", grading.ch04._step_without_clipping, "clip it to 1.0"),
        ("ch04_autocast_step", grading.ch04._step_clip_before_unscale, "clipped the *scaled*"),
        ("ch04_autocast_step", grading.ch04._step_without_update, "scaler.update() was not"),
        ("ch04_autocast_step", grading.ch04._step_optimizer_step_directly, "not optimizer.step()"),
        ("ch04_autocast_step", grading.ch04._step_backward_on_unscaled_loss, "unscaled loss"),
        ("ch06_sdpa_attention", grading.ch06._block_not_causal, "*without* the causal mask"),
        ("ch07_pad_vocab", grading.ch07._pad_untied, "weight tying is broken"),
        ("ch07_pad_vocab", grading.ch07._pad_round_down, "rounding down"),
        ("ch07_pad_vocab", grading.ch07._pad_always_add, "already a multiple"),
        ("ch07_pad_vocab", grading.ch07._pad_random_rows, "not zero"),
        ("ch07_pad_vocab", grading.ch07._pad_rows_in_front, "token id i keeps row i"),
        ("ch07_pad_vocab", grading.ch07._pad_config_unchanged, "vocab_multiple"),
        ("ch06_sdpa_attention", grading.ch06._block_scaled_twice, "scaled by 1/sqrt(hs) twice"),
        ("ch06_sdpa_attention", grading.ch06._block_softmax_over_queries, "(dim=-2)"),
        ("ch06_sdpa_attention", grading.ch06._block_heads_not_transposed, "transpose(1, 2)"),
        ("ch06_sdpa_attention", grading.ch06._block_no_output_projection, "attn.c_proj"),
        ("ch06_sdpa_attention", grading.ch06._block_mask_tensor, "(..., T, T)"),
        ("ch14_trace_peak", grading.ch14._peak_double_free, "subtract it once"),
        ("ch14_trace_peak", grading.ch14._peak_counts_segments, "(reserved memory)"),
        ("ch14_trace_peak", grading.ch14._peak_without_baseline, "(baseline)"),
        ("ch14_trace_peak", grading.ch14._peak_at_free_completed, "even while a stream"),
        ("ch14_trace_peak", grading.ch14._peak_final_value, "after the last event"),
        ("ch14_trace_peak", grading.ch14._peak_phase_of_the_next_start, "the phase of event i"),
        ("ch14_fragmentation", grading.ch14._frag_counts_pending, "active_pending_free"),
        ("ch14_fragmentation", grading.ch14._frag_requested_sizes, "requested_size is"),
        ("ch14_fragmentation", grading.ch14._frag_largest_segment, "largest single free block"),
        ("ch14_fragmentation", grading.ch14._frag_inverted, "1 - largest_free / free"),
        ("ch14_fragmentation", grading.ch14._frag_divides_by_zero, "divided by zero"),
    ],
)
def test_hint_names_the_mistake(grade_id, wrong, words):
    with pytest.raises(AssertionError, match=re.escape(words)):
        grading.CHECKS[grade_id](wrong)


def test_a_not_implemented_answer_propagates_for_the_grader():
    def stub(M, N, K):
        raise NotImplementedError("Write this function")

    with pytest.raises(NotImplementedError):
        grading.check_matmul_flops(stub)


# ---- student versions ------------------------------------------------------------------------


def solution_lines(nb) -> list[str]:
    """Stripped lines of 12+ characters inside BEGIN/END SOLUTION regions."""
    lines, inside = [], False
    for cell in nb.cells:
        for line in cell.source.splitlines():
            if "BEGIN SOLUTION" in line:
                inside = True
            elif "END SOLUTION" in line:
                inside = False
            elif inside and len(line.strip()) >= 12:
                lines.append(line.strip())
    return lines


def text_outside_solutions(nb) -> str:
    """Every line of every cell outside BEGIN/END SOLUTION regions, joined."""
    inside, kept = False, []
    for cell in nb.cells:
        for line in cell.source.splitlines():
            if "BEGIN SOLUTION" in line:
                inside = True
            elif "END SOLUTION" in line:
                inside = False
            elif not inside:
                kept.append(line)
    return "\n".join(kept)


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("student")
    assert grading.main(["make-student", str(FIXTURE.parent), "--out", str(out)]) == 0
    return out


def test_make_student_removes_solutions_and_outputs_and_keeps_metadata(student_dir):
    solution = nbformat.read(FIXTURE, as_version=4)
    assert any(c.get("outputs") for c in solution.cells), "the fixture should carry outputs"
    path = student_dir / FIXTURE.name
    student = nbformat.read(path, as_version=4)
    text = path.read_text()
    nbformat.validate(student)

    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    leaked = [line for line in solution_lines(solution) if line in text or line in json.dumps(text)]
    assert solution_lines(solution) and not leaked
    for cell in student.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    assert [c.metadata.get("nbgrader") for c in student.cells] == [
        c.metadata.get("nbgrader") for c in solution.cells
    ]
    assert grading.check_cells(student) == grading.check_cells(solution)


def test_stub_keeps_indentation_and_the_function_signature(student_dir):
    student = nbformat.read(student_dir / FIXTURE.name, as_version=4)
    source = student.cells[3].source
    assert source.startswith("def matmul_flops(M: int, N: int, K: int) -> int:")
    assert "    # YOUR CODE HERE\n    raise NotImplementedError(" in source
    compile(source, "cell", "exec")  # still valid Python


def test_make_student_only_writes_exercise_notebooks(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "notes.txt").write_text("not a notebook")
    nbformat.write(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")]), src / "plain.ipynb"
    )
    nbformat.write(nbformat.read(FIXTURE, as_version=4), src / "demo.ipynb")
    written = grading.make_student(src, tmp_path / "out")
    assert [p.name for p in written] == ["demo.ipynb"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["demo.ipynb"]


def test_make_student_refuses_to_overwrite_the_solutions():
    with pytest.raises(ValueError, match="choose another folder"):
        grading.make_student(FIXTURE.parent, FIXTURE.parent)


@pytest.mark.parametrize(
    "source,problem",
    [
        ("def f():\n    ### BEGIN SOLUTION\n    return 1\n", "never closed"),
        ("def f():\n    return 1\n    ### END SOLUTION\n", "never opened"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n", "still open"),
    ],
)
def test_unbalanced_markers_name_the_notebook_and_cell(tmp_path, source, problem):
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("intro"),
            nbformat.v4.new_code_cell(
                source, metadata={"nbgrader": {"solution": True, "grade_id": "bad_solution"}}
            ),
        ]
    )
    nbformat.write(nb, tmp_path / "broken.ipynb")
    with pytest.raises(grading.SolutionMarkerError) as info:
        grading.make_student(tmp_path / "broken.ipynb", tmp_path / "out")
    message = str(info.value)
    assert (
        "broken.ipynb" in message
        and "cell 2" in message
        and "bad_solution" in message
        and problem in message
    )
    assert not (tmp_path / "out" / "broken.ipynb").exists()


def test_hidden_tests_and_marker_free_solution_cells_are_removed():
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "answer = 42", metadata={"nbgrader": {"solution": True, "grade_id": "a"}}
            ),
            nbformat.v4.new_code_cell(
                "assert answer\n### BEGIN HIDDEN TESTS\nassert answer == 42\n### END HIDDEN TESTS",
                metadata={
                    "nbgrader": {"grade": True, "solution": False, "grade_id": "t", "points": 1}
                },
            ),
        ]
    )
    student = grading.student_version(nb)
    assert student.cells[0].source == grading.CODE_STUB
    assert student.cells[1].source == "assert answer"


# ---- grading ---------------------------------------------------------------------------------


def _check_cell_index(nb, grade_id: str) -> int:
    return next(
        i
        for i, c in enumerate(nb.cells)
        if grading.nbgrader_metadata(c).get("grade_id") == grade_id
    )


@pytest.fixture(scope="module")
def graded(tmp_path_factory, student_dir) -> tuple[list[dict], Path]:
    """Grade five submissions of the fixture: correct, blank, broken, dying, unreadable."""
    root = tmp_path_factory.mktemp("submissions")
    solution = nbformat.read(FIXTURE, as_version=4)

    def submit(student: str, nb=None, text: str | None = None) -> None:
        (root / student).mkdir()
        target = root / student / FIXTURE.name
        target.write_text(text) if text is not None else nbformat.write(nb, target)

    submit("alice", solution)  # the solution notebook itself
    submit(
        "bob", nbformat.read(student_dir / FIXTURE.name, as_version=4)
    )  # untouched student version

    broken = nbformat.read(student_dir / FIXTURE.name, as_version=4)
    broken.cells[3].source = broken.cells[3].source.replace(
        'raise NotImplementedError("Write this function: see the exercise text above")',
        "return M * N * K",
    )
    del broken.cells[_check_cell_index(broken, "ch00_tflops")]
    loss = _check_cell_index(broken, "ch01_loss_at_init") - 1
    broken.cells[loss].source = broken.cells[loss].source.replace(
        'raise NotImplementedError("Write this function: see the exercise text above")',
        "while True:\n        pass",
    )
    submit("carol", broken)

    dying = nbformat.read(FIXTURE, as_version=4)
    tflops = _check_cell_index(dying, "ch00_tflops")
    dying.cells[tflops - 1].source += "\nimport os\nos._exit(1)"
    dying.cells[
        _check_cell_index(dying, "ch00_matmul_flops")
    ].source = "pass  # a student's edit of the check"
    dying.cells[_check_cell_index(dying, "ch00_matmul_flops")].metadata["nbgrader"]["points"] = 100
    submit("dave", dying)

    submit("erin", text='{"cells": [ this is not json')
    out = root.parent / "grades.csv"
    code = grading.main(
        [
            "grade",
            str(root),
            "--out",
            str(out),
            "--timeout",
            "3",
            "--reference",
            str(FIXTURE.parent),
        ]
    )
    assert code == 0
    with open(out, newline="") as f:
        return list(csv.DictReader(f)), out


def _by_student(rows, student):
    return {
        r["grade_id"]: (r["points"], r["max_points"], r["status"], r["reason"])
        for r in rows
        if r["student"] == student
    }


def test_grade_csv_has_the_documented_columns(graded):
    rows, out = graded
    assert out.read_text().splitlines()[0] == ",".join(grading.COLUMNS)
    assert {r["student"] for r in rows} == {"alice", "bob", "carol", "dave", "erin"}
    assert all(r["notebook"] == FIXTURE.name for r in rows)


def test_correct_submission_gets_full_points(graded):
    assert _by_student(graded[0], "alice") == {
        "ch00_matmul_flops": ("1", "1", "passed", "passed"),
        "ch00_tflops": ("2", "2", "passed", "passed"),
        "ch01_loss_at_init": ("1", "1", "passed", "passed"),
    }


def test_blank_student_version_is_not_attempted(graded):
    rows = _by_student(graded[0], "bob")
    assert set(rows) == {"ch00_matmul_flops", "ch00_tflops", "ch01_loss_at_init"}
    assert all(
        r == ("0", r[1], "failed", "NotImplementedError: not attempted") for r in rows.values()
    )


def test_broken_submission_gets_clear_reasons(graded):
    rows = _by_student(graded[0], "carol")
    assert rows["ch00_matmul_flops"][:3] == ("0", "1", "failed")
    assert rows["ch00_matmul_flops"][3].startswith(
        "AssertionError: matmul_flops(2, 3, 4) returned 24 = M*N*K"
    )
    assert rows["ch00_tflops"] == (
        "0",
        "2",
        "missing",
        "check cell missing (deleted or metadata lost)",
    )
    assert rows["ch01_loss_at_init"][:3] == ("0", "1", "failed")
    assert re.fullmatch(r"timeout after 3 s in cell \d+", rows["ch01_loss_at_init"][3])


def test_points_and_check_code_come_from_the_reference_and_a_dead_kernel_is_reported(graded):
    rows = _by_student(graded[0], "dave")
    # the check was restored from the reference (the student replaced it by `pass`): it still
    # passes, and scores the reference's 1 point, not the student's 100.
    assert rows["ch00_matmul_flops"] == ("1", "1", "passed", "passed")
    assert rows["ch00_tflops"][:3] == ("0", "2", "failed")
    assert re.fullmatch(r"kernel died in cell \d+", rows["ch00_tflops"][3])
    assert rows["ch01_loss_at_init"][2:] == ("failed", rows["ch00_tflops"][3])


def test_unreadable_notebook_is_reported_not_crashed(graded):
    rows = _by_student(graded[0], "erin")
    assert set(rows) == {"ch00_matmul_flops", "ch00_tflops", "ch01_loss_at_init"}
    assert all(r[2] == "error" and r[3].startswith("notebook unreadable: ") for r in rows.values())


def test_missing_notebook_and_empty_student_folder_are_reported(tmp_path):
    (tmp_path / "subs" / "frank").mkdir(parents=True)
    rows = grading.grade(tmp_path / "subs", FIXTURE.parent, timeout=5)
    assert rows == [grading.grader._row("frank", "", "", 0, 0, "missing", "no notebook submitted")]


def _make_student(source: Path, out: Path, *extra: str) -> int:
    return grading.main(["make-student", str(source), "--out", str(out), *extra])


def test_make_student_never_overwrites_work_it_did_not_write(tmp_path, capsys):
    solutions = tmp_path / "notebooks"
    solutions.mkdir()
    (solutions / FIXTURE.name).write_bytes(FIXTURE.read_bytes())
    student = tmp_path / "student"
    assert _make_student(solutions, student) == 0
    assert _make_student(solutions, student) == 0  # its own unchanged output is replaced
    # arguments swapped: the student versions would be written over the solution notebooks
    before = (solutions / FIXTURE.name).read_bytes()
    assert _make_student(student, solutions) == 2
    assert "not written by make-student" in capsys.readouterr().err
    assert (solutions / FIXTURE.name).read_bytes() == before
    # a learner filled in the student version: re-running refuses, --force replaces
    filled = nbformat.read(student / FIXTURE.name, as_version=4)
    filled.cells[3].source = filled.cells[3].source.replace(
        "raise NotImplementedError", "return 0  #"
    )
    nbformat.write(filled, student / FIXTURE.name)
    assert _make_student(solutions, student) == 2
    assert "changed after make-student wrote it" in capsys.readouterr().err
    assert "return 0  #" in (student / FIXTURE.name).read_text()
    assert _make_student(solutions, student, "--force") == 0
    assert "return 0  #" not in (student / FIXTURE.name).read_text()
    # a learner ran it without editing a cell: its outputs are theirs, so refused as well
    ran = nbformat.read(student / FIXTURE.name, as_version=4)
    code = next(c for c in ran.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="a learner's run\n")]
    nbformat.write(ran, student / FIXTURE.name)
    assert _make_student(solutions, student) == 2
    assert "changed after make-student wrote it" in capsys.readouterr().err


def test_make_student_never_writes_through_a_link_in_out(tmp_path, capsys):
    """A link planted where a student version goes would make the write land at its target."""
    solutions, student = tmp_path / "notebooks", tmp_path / "student"
    solutions.mkdir()
    student.mkdir()
    (solutions / FIXTURE.name).write_bytes(FIXTURE.read_bytes())
    elsewhere = tmp_path / "created-elsewhere.ipynb"
    (student / FIXTURE.name).symlink_to(elsewhere)
    assert _make_student(solutions, student) == 2
    assert "is a link" in capsys.readouterr().err and not elsewhere.exists()
    assert _make_student(solutions, student, "--force") == 0  # the link is replaced, not followed
    assert not elsewhere.exists() and not (student / FIXTURE.name).is_symlink()


def test_make_student_refuses_a_file_as_out_with_one_line(tmp_path, capsys):
    (tmp_path / "out.txt").write_text("not a folder")
    assert _make_student(FIXTURE.parent, tmp_path / "out.txt") == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("is a file: give a folder for the student versions")
    )
    assert (tmp_path / "out.txt").read_text() == "not a folder"


@pytest.mark.parametrize("text", ["{}", "[]", '{"cells": 5}', '"just a string"', "not json"])
def test_a_file_that_is_not_a_notebook_stops_the_tools_in_one_line(tmp_path, capsys, text):
    bad = tmp_path / "ref" / "broken.ipynb"
    bad.parent.mkdir()
    bad.write_text(text)
    assert _make_student(bad, tmp_path / "student") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "broken.ipynb is not a notebook" in err
    assert "\n" not in err and not (tmp_path / "student").exists()
    (tmp_path / "subs" / "alice").mkdir(parents=True)
    out = tmp_path / "grades.csv"
    argv = ["grade", str(tmp_path / "subs"), "--reference", str(bad.parent), "--out", str(out)]
    assert grading.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "broken.ipynb" in err, err


def test_a_temporary_folder_too_long_for_the_socket_stops_grading_in_one_line(
    tmp_path, capsys, monkeypatch
):
    import tempfile

    long = tmp_path / ("t" * 120)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    (tmp_path / "subs" / "alice").mkdir(parents=True)
    argv = ["grade", str(tmp_path / "subs"), "--reference", str(FIXTURE.parent),
            "--out", str(tmp_path / "grades.csv")]  # fmt: skip
    assert grading.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "set TMPDIR to a shorter folder" in err and "\n" not in err


@pytest.mark.parametrize("timeout", ["0", "-5", "ten"])
def test_grade_refuses_a_timeout_that_is_not_a_positive_number_of_seconds(timeout, capsys):
    with pytest.raises(SystemExit) as exit_:
        grading.main(["grade", "subs", "--timeout", timeout])
    assert exit_.value.code == 2
    assert "--timeout" in capsys.readouterr().err


def test_grade_out_never_replaces_a_notebook_or_a_file_that_is_not_a_grades_csv(tmp_path, capsys):
    subs = tmp_path / "subs"
    (subs / "frank").mkdir(parents=True)
    notebook = subs / "frank" / FIXTURE.name

    def grade(out: Path, *extra: str) -> int:
        return grading.main(
            [
                "grade",
                str(subs),
                "--out",
                str(out),
                "--reference",
                str(FIXTURE.parent),
                "--timeout",
                "5",
                *extra,
            ]
        )

    assert grade(notebook) == 2 and not notebook.exists()  # a notebook's name, in the submissions
    assert grade(tmp_path / "grades.ipynb") == 2
    assert grade(FIXTURE.parent / "grades.csv", "--force") == 2  # inside the reference folder
    notes = tmp_path / "notes.csv"
    notes.write_text("a teacher's notes")
    assert grade(notes) == 2 and notes.read_text() == "a teacher's notes"
    assert grade(tmp_path / "notes.txt") == 2  # the CSV is written as .csv
    err = capsys.readouterr().err
    assert "notebook's name" in err and "reference notebooks folder" in err and "--force" in err
    out = tmp_path / "grades.csv"
    assert grade(out) == 0 and grade(out) == 0  # a grades CSV of an earlier run is replaced
    assert grade(notes, "--force") == 0 and notes.read_text().startswith(",".join(grading.COLUMNS))


def test_grade_out_that_cannot_be_written_fails_in_one_line_before_grading(
    tmp_path, capsys, monkeypatch
):
    from helpers.grading import grader

    graded = []
    monkeypatch.setattr(grader, "grade", lambda *a, **k: graded.append(1) or [])
    (tmp_path / "subs" / "frank").mkdir(parents=True)
    (tmp_path / "README.md").write_text("a file")
    for out in (tmp_path / "README.md" / "grades.csv", Path("/proc/grades.csv")):
        args = ["grade", str(tmp_path / "subs"), "--out", str(out)]
        assert grading.main([*args, "--reference", str(FIXTURE.parent)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("choose a path in a writable folder" in e for e in err), err
    assert graded == []


def test_command_line_help_runs_without_nbgrader():
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['nbgrader'] = None; "
            "from helpers.grading import main; main(['--help'])",
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert result.returncode == 0 and "make-student" in result.stdout and "grade" in result.stdout


def test_nbgrader_config_uses_the_same_stub_and_a_long_timeout():
    from traitlets.config import Config

    path = Path(__file__).resolve().parents[1] / "nbgrader_config.py"
    config = Config()
    namespace = {"c": config, "get_config": lambda: config, "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    assert config.ClearSolutions.code_stub["python"] == grading.CODE_STUB
    assert config.ClearSolutions.text_stub == grading.TEXT_STUB
    assert config.ExecutePreprocessor.timeout >= 1800


# ---- every real exercise notebook ----------------------------------------------------------------


def exercise_notebooks() -> list[Path]:
    found = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        try:
            if grading.check_cells(nbformat.read(path, as_version=4)):
                found.append(path)
        except Exception:  # an unreadable notebook is nbval's business, not this test's
            continue
    return found


def student_run_problems(solution, cwd: Path) -> list[str]:
    """Execute the student version of ``solution``: what went wrong, one line per cell ([] = as it
    should be: the graded cells fail, only those, only as "not attempted" or a hint, and the kernel
    survives). Only the cells a blank can change run, with the cells they need
    (tests/notebook_slice.py); nbval runs the rest, unchanged, in the solution notebook."""
    student = grading.student_version(solution)
    graded_cells = {index for index, _ in grading.check_cells(student).values()}
    code = [i for i, c in enumerate(student.cells) if c.cell_type == "code" and c.source.strip()]
    learner = {k for k, i in enumerate(code) if grading.is_solution_cell(student.cells[i])}
    checks = {k for k, i in enumerate(code) if i in graded_cells}
    kept = [
        code[k]
        for k in notebook_slice.cells_to_run(
            [student.cells[i].source for i in code], learner, checks
        )
    ]
    assert set(kept) >= graded_cells and len(learner) == len(checks) > 0
    reduced = nbformat.v4.new_notebook(
        metadata=student.metadata, cells=[student.cells[i] for i in kept]
    )
    run = grading.execute_notebook(reduced, cwd=cwd, timeout=600)
    if (
        run.startup_error
        or run.kernel_died_in is not None
        or run.stuck_after_timeout_in is not None
    ):
        return [
            f"kernel: {run.startup_error} died in {run.kernel_died_in} stuck in "
            f"{run.stuck_after_timeout_in}"
        ]
    problems = []
    for position, cell in run.cells.items():
        index = kept[position]
        if index in graded_cells and not (
            cell.status == "error" and cell.ename in ("AssertionError", "NotImplementedError")
        ):
            problems.append(
                f"graded cell {index + 1}: {cell.status} {cell.ename} {cell.evalue[:80]}"
            )
        if index not in graded_cells and cell.status != "ok":
            problems.append(
                f"cell {index + 1} (not graded): {cell.status} {cell.ename} {cell.evalue[:80]}"
            )
    return problems


@pytest.mark.notebooks
@pytest.mark.parametrize("path", exercise_notebooks(), ids=lambda p: p.name)
def test_student_version_of_real_notebook_fails_exactly_the_graded_cells(path):
    solution = nbformat.read(path, as_version=4)
    student = grading.student_version(solution, name=str(path))

    # (c) no solution text leaks (a line the notebook also shows outside a solution is not a leak)
    text = "\n".join(c.source for c in student.cells)
    public = text_outside_solutions(solution)
    leaked = [line for line in solution_lines(solution) if line in text and line not in public]
    assert not leaked, f"solution lines left in the student version: {leaked}"

    # (b) executed, it fails the graded cells, only those
    problems = student_run_problems(solution, path.parent)
    assert not problems, "\n".join(problems)


def test_a_later_cell_that_calls_the_learners_function_is_caught():
    """The reduced run keeps every cell that depends on a learner's name, so this one fails it."""
    solution = nbformat.read(FIXTURE, as_version=4)
    assert student_run_problems(solution, FIXTURE.parent) == []
    check = _check_cell_index(solution, "ch00_matmul_flops")
    fn = re.search(r"def (\w+)\(", solution.cells[check - 1].source).group(1)
    solution.cells.insert(check + 1, nbformat.v4.new_code_cell(f"print({fn}(2, 3, 4))"))
    problems = student_run_problems(solution, FIXTURE.parent)
    assert len(problems) == 1 and "(not graded): error NotImplementedError" in problems[0], problems


def test_a_submission_that_replaces_the_checks_does_not_pass(tmp_path):
    import nbformat

    nb = nbformat.read(FIXTURE, as_version=4)
    for cell in nb.cells:
        if grading.is_solution_cell(cell):
            cell.source = cell.source + "\ngrading.check_matmul_flops = lambda fn: print('PASS')\n"
            cell.source = cell.source + "grading.check_tflops = lambda fn: print('PASS')\n"
    (tmp_path / "cheat").mkdir()
    nbformat.write(nb, tmp_path / "cheat" / FIXTURE.name)
    # the cheat also answers wrongly, so only the real checks can fail it
    text = (
        (tmp_path / "cheat" / FIXTURE.name)
        .read_text()
        .replace("return 2 * multiply_adds", "return 0")
    )
    (tmp_path / "cheat" / FIXTURE.name).write_text(text)
    out = tmp_path.parent / f"{tmp_path.name}-grades.csv"  # outside the submissions folder
    assert (
        grading.main(
            [
                "grade",
                str(tmp_path),
                "--out",
                str(out),
                "--reference",
                str(FIXTURE.parent),
                "--timeout",
                "60",
            ]
        )
        == 0
    )
    rows = {r["grade_id"]: r for r in csv.DictReader(out.open())}
    assert rows["ch00_matmul_flops"]["status"] == "failed"


def test_the_registry_lists_every_chapter_module_each_of_the_same_shape():
    import pkgutil

    names = sorted(
        m.name for m in pkgutil.iter_modules(grading.__path__) if re.fullmatch(r"ch\d\d", m.name)
    )
    assert [
        m.__name__.rsplit(".", 1)[1] for m in grading.CHAPTERS
    ] == names  # none forgotten, in order
    for module in grading.CHAPTERS:
        chapter = module.__name__.rsplit(".", 1)[1]
        assert set(module.CHECKS) == set(module.WRONG_ANSWERS) <= set(module.SECTIONS), chapter
        assert all(gid.startswith(chapter + "_") for gid in module.SECTIONS), chapter
        for check in module.CHECKS.values():  # notebooks call grading.check_x
            assert getattr(grading, check.__name__) is check


def test_merging_refuses_two_chapters_with_one_grade_id():
    import types

    a = types.SimpleNamespace(__name__="a", CHECKS={"ch99_x": print})
    b = types.SimpleNamespace(__name__="b", CHECKS={"ch99_x": len})
    assert grading.merged((a,), "CHECKS") == {"ch99_x": print}
    with pytest.raises(RuntimeError, match="b redefines grade ids"):
        grading.merged((a, b), "CHECKS")


def test_a_check_cell_must_be_one_call_of_its_registered_check():
    assert grading.grader.check_call("grading.check_tflops(achieved_tflops)", "ch00_tflops") == (
        "achieved_tflops"
    )
    bad = [
        "grading.check_matmul_flops(achieved_tflops)",  # another grade id's check
        "grading.check_tflops(achieved_tflops)\nprint('more')",  # more than the call
        "check_tflops(achieved_tflops)",
        "grading.check_tflops(lambda *a: 1.0)",  # not a name the kernel resolves
        "grading.check_tflops(achieved_tflops, strict=False)",
        "grading.check_tflops(",
    ]
    for source in bad:
        with pytest.raises(ValueError, match="ch00_tflops"):
            grading.grader.check_call(source, "ch00_tflops")
    with pytest.raises(ValueError, match="names no check"):
        grading.grader.check_call("grading.check_tflops(f)", "ch99_nothing")


def test_the_reduced_run_keeps_what_a_blank_changes_and_what_that_needs():
    sources = [
        "import math",  # 0: read by 5
        "x = expensive()",  # 1: nothing a blank changes reads x
        "def f():\n    raise NotImplementedError",  # 2: the learner's cell
        "check(f)",  # 3: its check
        "y = f()",  # 4: depends on the learner's function
        "print(y, math.pi)",  # 5: depends on 4
        "plot(x)",  # 6: independent of the exercise
        "%matplotlib inline\nz = 1",  # 7: IPython syntax parses
    ]
    assert notebook_slice.cells_to_run(sources, learner={2}, always={3}) == [0, 2, 3, 4, 5]


def _solution_cell_with(extra: str) -> "nbformat.NotebookNode":
    """The fixture's solution notebook with ``extra`` run at the end of its first solution cell."""
    nb = nbformat.read(FIXTURE, as_version=4)
    first = next(c for c in nb.cells if grading.is_solution_cell(c))
    first.source += "\n" + extra
    return nb


def _grade(subs: Path, tmp_path: Path) -> dict[str, dict]:
    out = tmp_path / "grades.csv"
    args = [
        "grade",
        str(subs),
        "--out",
        str(out),
        "--reference",
        str(FIXTURE.parent),
        "--timeout",
        "60",
    ]
    assert grading.main(args) == 0
    rows: dict[str, dict] = {}
    for r in csv.DictReader(out.open()):
        rows.setdefault(r["student"], {})[r["grade_id"]] = r
    return rows


needs_sandbox = pytest.mark.skipif(
    not grading.sandbox.sandbox_available()[0],
    reason=f"no OS sandbox here: {grading.sandbox.sandbox_available()[1]}",
)


@needs_sandbox
def test_a_submission_cannot_read_the_reference_solutions(tmp_path):
    """A blank notebook that execs the reference's solution cells after its own scores nothing."""
    steal = (
        "import json, pathlib, helpers\n"
        f"for p in [pathlib.Path({str(FIXTURE)!r}), "
        "*pathlib.Path(helpers.__file__).parents[1].rglob('*.ipynb')]:\n"
        "    try:\n"
        "        cells = json.loads(p.read_text())['cells']\n"
        "    except Exception:\n"
        "        continue\n"
        "    for c in cells:\n"
        "        if c.get('metadata', {}).get('nbgrader', {}).get('solution'):\n"
        "            try:\n"
        "                exec(''.join(c['source']), globals())\n"
        "            except Exception:\n"
        "                pass\n"
    )
    blank = _blank_with(steal)  # each blank function then overwritten by the reference's
    (tmp_path / "subs" / "mallory").mkdir(parents=True)
    nbformat.write(blank, tmp_path / "subs" / "mallory" / FIXTURE.name)
    rows = _grade(tmp_path / "subs", tmp_path)
    assert all(r["points"] == "0" for r in rows["mallory"].values()), rows["mallory"]


@needs_sandbox
def test_a_submission_cannot_read_the_solutions_of_the_checkout_the_environment_points_at(
    tmp_path, monkeypatch
):
    """The environment was installed (editable) from another clone, whose path a submission
    reads in site-packages: mallory (blank) execs that clone's solution cells and scores 0."""
    import os
    import uuid
    from importlib import metadata

    # outside /tmp (empty in the sandbox anyway) and outside the checkout (hidden anyway)
    writable = [
        p
        for p in (grading.grader.REPO_ROOT.parent, Path("/srv"), Path("/opt"))
        if p.is_dir() and os.access(p, os.W_OK)
    ]
    if not writable:
        pytest.skip("no writable folder outside /tmp and the checkout for a second clone")
    other = writable[0] / f"grading-test-clone-{uuid.uuid4().hex[:8]}"
    (other / "notebooks").mkdir(parents=True)
    shutil.copy(FIXTURE, other / "notebooks" / FIXTURE.name)

    class Dist:
        def read_text(self, name):
            return json.dumps({"url": other.as_uri(), "dir_info": {"editable": True}})

    monkeypatch.setattr(metadata, "distribution", lambda name: Dist())
    (other / "helpers").mkdir()
    steal = (
        "import json, pathlib\n"
        "try:\n"
        f"    pathlib.Path({str(other / 'helpers' / 'planted.py')!r}).write_text('')\n"
        "except OSError:\n"
        "    pass\n"
        f"for p in pathlib.Path({str(other)!r}).rglob('*.ipynb'):\n"
        "    for c in json.loads(p.read_text())['cells']:\n"
        "        if c.get('metadata', {}).get('nbgrader', {}).get('solution'):\n"
        "            exec(''.join(c['source']), globals())\n"
    )
    mallory = _blank_with(steal)
    (tmp_path / "subs" / "mallory").mkdir(parents=True)
    nbformat.write(mallory, tmp_path / "subs" / "mallory" / FIXTURE.name)
    try:
        rows = _grade(tmp_path / "subs", tmp_path)
        planted = (other / "helpers" / "planted.py").exists()
    finally:
        shutil.rmtree(other)
    assert all(r["points"] == "0" for r in rows["mallory"].values()), rows["mallory"]
    assert not planted, "a submission wrote into the checkout the environment points at"


def _blank_version() -> "nbformat.NotebookNode":
    """The fixture's student version: every solution stubbed."""
    blank = nbformat.read(FIXTURE, as_version=4)
    for cell in blank.cells:
        if grading.is_solution_cell(cell):
            cell.source = (
                grading.student_version(nbformat.v4.new_notebook(cells=[cell])).cells[0].source
            )
    return blank


def _blank_with(extra: str) -> "nbformat.NotebookNode":
    """:func:`_blank_version` with ``extra`` run at the end of every solution cell."""
    blank = _blank_version()
    for cell in blank.cells:
        if grading.is_solution_cell(cell):
            cell.source += "\n" + extra
    return blank


@needs_sandbox
def test_a_submission_cannot_see_the_graders_processes_or_reach_files_through_proc(tmp_path):
    """mallory (blank) reads the reference through /proc/<pid>/root and /proc/<pid>/cwd of every
    process it can see and runs its solutions; oscar (correct) breaks his own answer whenever he
    can see or signal the grader's pid. Both must score nothing that way."""
    import os

    steal = (
        "import glob, json\n"
        f"for p in glob.glob('/proc/*/root{FIXTURE}') + glob.glob('/proc/*/cwd'):\n"
        "    try:\n"
        "        cells = json.load(open(p))['cells']\n"
        "    except Exception:\n"
        "        continue\n"
        "    for c in cells:\n"
        "        if c.get('metadata', {}).get('nbgrader', {}).get('solution'):\n"
        "            exec(''.join(c['source']), globals())\n"
    )
    mallory = _blank_with(steal)
    probe = (
        "import os\n"
        f"seen = os.path.exists('/proc/{os.getpid()}') or os.getppid() == {os.getpid()}\n"
        "try:\n"
        f"    os.kill({os.getpid()}, 0)\n"
        "    seen = True\n"
        "except OSError:\n"
        "    pass\n"
        "if seen:\n"
        "    del matmul_flops\n"
    )
    for student, nb in (("mallory", mallory), ("oscar", _solution_cell_with(probe))):
        (tmp_path / "subs" / student).mkdir(parents=True)
        nbformat.write(nb, tmp_path / "subs" / student / FIXTURE.name)
    rows = _grade(tmp_path / "subs", tmp_path)
    assert all(r["points"] == "0" for r in rows["mallory"].values()), rows["mallory"]
    assert rows["oscar"]["ch00_matmul_flops"]["status"] == "passed", rows["oscar"]


@needs_sandbox
def test_one_submission_cannot_change_how_later_ones_are_graded(tmp_path):
    """aaa leaves an IPython startup file that turns every check into `pass` (in its home and in
    the teacher's), a .pth file in the environment and a file in the shared temp folder; bbb,
    graded after it, is the untouched student version and must still score 0."""
    import site
    import tempfile

    pth = Path(site.getsitepackages()[0]) / "zz_grader_test.pth"
    shared_tmp = Path(tempfile.gettempdir()) / "zz-grader-test"  # the grader's own temp folder
    startup = (
        "get_ipython().input_transformers_cleanup.append("
        "lambda lines: ['pass\\n'] if any('check_' in x for x in lines) else lines)\n"
    )
    leave = (
        "import os, pathlib\n"
        f"for home in (os.path.expanduser('~'), {str(Path.home())!r}):\n"
        "    d = pathlib.Path(home, '.ipython', 'profile_default', 'startup')\n"
        "    try:\n"
        "        d.mkdir(parents=True, exist_ok=True)\n"
        f"        (d / '00-zz-grader-test.py').write_text({startup!r})\n"
        "    except OSError as e:\n"
        "        print(e)\n"
        f"for f in ({str(pth)!r}, {str(shared_tmp)!r}):\n"
        "    try:\n"
        "        pathlib.Path(f).write_text('import os\\n')\n"
        "    except OSError as e:\n"
        "        print(e)\n"
    )
    subs = tmp_path / "subs"
    (subs / "aaa").mkdir(parents=True)
    (subs / "bbb").mkdir(parents=True)
    nbformat.write(_solution_cell_with(leave), subs / "aaa" / FIXTURE.name)
    nbformat.write(_blank_version(), subs / "bbb" / FIXTURE.name)
    real_startup = Path.home() / ".ipython" / "profile_default" / "startup"
    try:
        rows = _grade(subs, tmp_path)
        assert all(r["points"] == "0" for r in rows["bbb"].values()), rows["bbb"]
        assert not pth.exists() and not shared_tmp.exists()
        assert not (real_startup / "00-zz-grader-test.py").exists()
    finally:  # never leave them behind, even when the sandbox failed
        for f in (pth, shared_tmp, real_startup / "00-zz-grader-test.py"):
            f.unlink(missing_ok=True)


# In-kernel tricks that let a blank notebook score full marks when the grader ran its check cells
# through whatever the submission left in place.
IN_KERNEL_CHEATS = {
    "reload": (
        "import importlib, helpers.grading as g\n"
        "importlib.reload = lambda m: m\n"
        "for mod in (g, *g.CHAPTERS):\n"
        "    for n in dir(mod):\n"
        "        if n.startswith('check_'):\n"
        "            setattr(mod, n, lambda *a, **k: print('PASS'))\n"
    ),
    "input_transformer": (
        "get_ipython().input_transformers_cleanup.append(\n"
        "    lambda lines: ['pass\\n'] if any('check_' in x for x in lines) else lines)\n"
    ),
    "ast_transformer": (
        "import ast\n"
        "class _T(ast.NodeTransformer):\n"
        "    def visit_Module(self, node):\n"
        "        if 'check_' in ast.dump(node):\n"
        "            node.body = [ast.Pass()]\n"
        "        return node\n"
        "get_ipython().ast_transformers.append(_T())\n"
    ),
    "meta_path": (
        "import sys, importlib.abc, importlib.util\n"
        "class _F(importlib.abc.MetaPathFinder, importlib.abc.Loader):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.startswith('helpers.grading.ch'):\n"
        "            return importlib.util.spec_from_loader(name, self)\n"
        "    def create_module(self, spec):\n"
        "        return None\n"
        "    def exec_module(self, m):\n"
        "        for n in [n for n in vars(m) if n.startswith('check_')]:\n"
        "            delattr(m, n)\n"
        "        m.CHECKS, m.SECTIONS, m.WRONG_ANSWERS = {}, {}, {}\n"
        "        m.__getattr__ = lambda n: (lambda *a, **k: print('PASS'))\n"
        "sys.meta_path.insert(0, _F())\n"
    ),
    "run_cell": (
        "_ip = get_ipython()\n"
        "_run, _run_async = _ip.run_cell, _ip.run_cell_async\n"
        "def _fake(cell):\n"
        "    return 'pass' if 'check_' in cell else cell\n"
        "_ip.run_cell = lambda cell, *a, **k: _run(_fake(cell), *a, **k)\n"
        "async def _run_cell_async(cell, *a, **k):\n"
        "    return await _run_async(_fake(cell), *a, **k)\n"
        "_ip.run_cell_async = _run_cell_async\n"
    ),
    # blinds the grader's restore itself: the checks are then not run at all
    "user_expressions": "get_ipython().user_expressions = lambda expressions: {}\n",
    # a folder put first on helpers.__path__: the fresh import of the checks would load its fake
    "helpers_path": (
        "import helpers, os, tempfile\n"
        "_d = tempfile.mkdtemp()\n"
        "os.makedirs(_d + '/grading')\n"
        "open(_d + '/grading/__init__.py', 'w').write(\n"
        "    'CHAPTERS = ()\\ndef __getattr__(n):\\n    return lambda *a, **k: None\\n')\n"
        "helpers.__path__.insert(0, _d)\n"
    ),
    # every cell "succeeds": the reply the grader reads would say ok
    "execution_result": (
        "from IPython.core.interactiveshell import ExecutionResult\n"
        "ExecutionResult.success = property(lambda self: True)\n"
    ),
    # the kernel's replies rewritten on their way out: an error reply is sent as ok
    "session_send": (
        "_s = get_ipython().kernel.session\n"
        "_send = _s.send\n"
        "def _ok(stream, msg_or_type, content=None, *a, **k):\n"
        "    if msg_or_type == 'execute_reply' and isinstance(content, dict) \\\n"
        "            and content.get('status') == 'error':\n"
        "        content = {'status': 'ok', 'execution_count': content.get('execution_count'),\n"
        "                   'user_expressions': {}, 'payload': []}\n"
        "    return _send(stream, msg_or_type, content, *a, **k)\n"
        "_s.send = _ok\n"
    ),
    # the loader that runs every imported module's code: the checks are replaced once loaded
    "loader": (
        "from importlib.machinery import SourceFileLoader\n"
        "_orig = SourceFileLoader.exec_module\n"
        "def _em(self, module):\n"
        "    _orig(self, module)\n"
        "    if module.__name__.startswith('helpers.grading'):\n"
        "        for k in list(vars(module)):\n"
        "            if k.startswith('check_'):\n"
        "                setattr(module, k, lambda *a, **kw: print('PASS'))\n"
        "SourceFileLoader.exec_module = _em\n"
    ),
    # a .pyc of each rewritten check, with the source's time and size, where imports look first
    "pycache_prefix": (
        "import sys, os, glob, tempfile, importlib.util, importlib._bootstrap_external as be\n"
        "import helpers\n"
        "sys.pycache_prefix = tempfile.mkdtemp()\n"
        "for src in glob.glob(os.path.join(helpers.__path__[0], 'grading', 'ch*.py')):\n"
        "    st = os.stat(src)\n"
        "    tail = ('\\nfor _k in list(globals()):\\n    if _k.startswith(\"check_\"):\\n'\n"
        "            '        globals()[_k] = lambda *a, **k: print(\"PASS\")\\n')\n"
        "    code = compile(open(src).read() + tail, src, 'exec')\n"
        "    dst = importlib.util.cache_from_source(src)\n"
        "    os.makedirs(os.path.dirname(dst), exist_ok=True)\n"
        "    open(dst, 'wb').write(be._code_to_timestamp_pyc(code, st.st_mtime, st.st_size))\n"
    ),
    # a fake importlib in sys.modules, whose reload replaces the checks
    "importlib_module": (
        "import sys, types, importlib\n"
        "_fake = types.ModuleType('importlib')\n"
        "_fake.__dict__.update(importlib.__dict__)\n"
        "def _reload(m):\n"
        "    for k in list(vars(m)):\n"
        "        if k.startswith('check_'):\n"
        "            setattr(m, k, lambda *a, **kw: print('PASS'))\n"
        "    return m\n"
        "_fake.reload = _reload\n"
        "sys.modules['importlib'] = _fake\n"
    ),
    # the Session's packer (a traitlet) turns an error reply into ok
    "session_pack": (
        "_s = get_ipython().kernel.session\n"
        "_orig = _s.pack\n"
        "def _pack(o):\n"
        "    if isinstance(o, dict) and o.get('status') == 'error' and 'execution_count' in o:\n"
        "        o = {'status': 'ok', 'execution_count': o['execution_count'],\n"
        "             'user_expressions': o.get('user_expressions', {}), 'payload': []}\n"
        "    return _orig(o)\n"
        "_s.pack = _pack\n"
    ),
    # the module's name ExecutionResult bound to a subclass whose cells always succeed
    "execution_result_name": (
        "import IPython.core.interactiveshell as _ish\n"
        "class _R(_ish.ExecutionResult):\n"
        "    success = property(lambda self: True)\n"
        "_ish.ExecutionResult = _R\n"
    ),
    # the kernel's table of message handlers: a check cell's code is replaced on arrival
    "shell_handlers": (
        "import inspect\n"
        "_k = get_ipython().kernel\n"
        "_orig = _k.shell_handlers['execute_request']\n"
        "async def _h(stream, ident, parent):\n"
        "    if 'check_' in parent['content'].get('code', ''):\n"
        "        parent['content']['code'] = 'pass'\n"
        "    r = _orig(stream, ident, parent)\n"
        "    return (await r) if inspect.isawaitable(r) else r\n"
        "_k.shell_handlers['execute_request'] = _h\n"
    ),
}


def test_in_kernel_tricks_do_not_make_a_blank_notebook_pass(tmp_path):
    """Each trick (replacing importlib.reload, an input or AST transformer, a sys.meta_path
    finder, a patched run_cell) in an otherwise blank notebook: the grader restores the kernel's
    machinery before each check cell (helpers/grading/guard.py), so every check fails."""
    for name, cheat in IN_KERNEL_CHEATS.items():
        nb = _blank_version()
        first = next(c for c in nb.cells if grading.is_solution_cell(c))
        first.source += "\n" + cheat
        (tmp_path / "subs" / name).mkdir(parents=True)
        nbformat.write(nb, tmp_path / "subs" / name / FIXTURE.name)
    rows = _grade(tmp_path / "subs", tmp_path)
    scored = {s: [g for g, r in per.items() if r["points"] != "0"] for s, per in rows.items()}
    assert scored == {name: [] for name in IN_KERNEL_CHEATS}, rows
    assert {r["reason"] for r in rows["user_expressions"].values()} == {
        "GraderGuardError: the grader could not restore the kernel's state before this check "
        "(the submission changed how the kernel runs code)"
    }


# What the pickle attack below would create if the checker unpickled it: the system's temporary
# folder, which the checker (outside the sandbox) shares with this test.
PWNED = str(Path(tempfile.gettempdir(), "pwned-by-submission"))

# Attacks that beat the checks while they ran in the submission's kernel (the documented
# in-process limit): each now meets a check that runs in the grader's checker process.
OUT_OF_PROCESS_CHEATS = {
    # the guard's restore replaced by one that answers as expected and restores nothing
    "fake_restore": (
        "import helpers.grading.guard as _g\n"
        "_g.restore = lambda nonce: f'restored {nonce}'\n"
        "import helpers.grading as _hg\n"
        "for _n in list(_hg.CHECKS): _hg.CHECKS[_n] = lambda fn: print('PASS')\n"
        "_hg.check_matmul_flops = _hg.check_tflops = _hg.check_loss_at_init = print\n"
    ),
    # a thread that re-patches every check after any restore
    "patch_thread": (
        "import threading, time, sys\n"
        "def _again():\n"
        "    while True:\n"
        "        for _m in [m for k, m in list(sys.modules.items()) if 'grading' in k]:\n"
        "            for _k in [k for k in vars(_m) if k.startswith('check_')]:\n"
        "                setattr(_m, _k, lambda fn: print('PASS'))\n"
        "        time.sleep(0.001)\n"
        "threading.Thread(target=_again, daemon=True).start()\n"
    ),
    # the kernel's answers rewritten on their way out (socket.socket.sendall, which the guard
    # does not restore): every call of the learner's function "returns" a made-up number
    "fake_answers": (
        "import socket as _s, struct as _st, json as _j\n"
        "_s.socket.real_sendall = getattr(_s.socket, 'real_sendall', _s.socket.sendall)\n"
        "def _sendall(self, data, *a):\n"
        "    if b'\"raise\"' in data[4:20] or b'\"result\"' in data[4:20]:\n"
        "        body = _j.dumps(['result', 48]).encode()\n"
        "        data = _st.pack('!I', len(body)) + body\n"
        "    return _s.socket.real_sendall(self, data, *a)\n"
        "_s.socket.sendall = _sendall\n"
    ),
    # the same, with a pickle in place of the answer (unpickled, it would run os.system)
    "pickle_reply": (
        "import socket as _s, struct as _st, pickle as _p, os as _os\n"
        "class _Evil:\n"
        "    def __reduce__(self):\n"
        f"        return (_os.system, ('touch {PWNED}',))\n"
        "_s.socket.real_sendall = getattr(_s.socket, 'real_sendall', _s.socket.sendall)\n"
        "def _sendall(self, data, *a):\n"
        "    if b'\"raise\"' in data[4:20] or b'\"result\"' in data[4:20]:\n"
        "        body = _p.dumps(['result', _Evil()])\n"
        "        data = _st.pack('!I', len(body)) + body\n"
        "    return _s.socket.real_sendall(self, data, *a)\n"
        "_s.socket.sendall = _sendall\n"
    ),
}


def test_attacks_on_the_check_itself_score_nothing_because_it_runs_in_another_process(tmp_path):
    """A blank notebook plus each attack that replaced the checks or their restore inside the
    kernel: the checks run in the grader's checker process (helpers/grading/remote.py), which no
    code of a submission reaches, so every check still fails; a pickle is never unpickled there."""
    for name, cheat in OUT_OF_PROCESS_CHEATS.items():
        (tmp_path / "subs" / name).mkdir(parents=True)
        nbformat.write(_blank_with(cheat), tmp_path / "subs" / name / FIXTURE.name)
    rows = _grade(tmp_path / "subs", tmp_path)
    scored = {s: [g for g, r in per.items() if r["points"] != "0"] for s, per in rows.items()}
    assert scored == {name: [] for name in OUT_OF_PROCESS_CHEATS}, rows
    assert not Path(PWNED).exists()
    for name in ("fake_answers", "pickle_reply"):  # the rewritten answers reached the checker
        reasons = {r["reason"] for r in rows[name].values()}
        assert "NotImplementedError: not attempted" not in reasons, (name, reasons)
    reasons = {r["reason"] for r in rows["pickle_reply"].values()}
    assert all(r.startswith("GraderError: the kernel's connection broke") for r in reasons), reasons


# Takes the checker's socket: unlinks it as soon as it appears, listens there with a full
# backlog, and refuses the kernel's own connection (the grader's wait must still end).
TAKE_THE_SOCKET = """
import os, socket, threading, time
_own = os.path.dirname(os.environ['HOME'])
_addr = os.path.join(_own, 'checker', 'check.sock')
_orig_connect = socket.socket.connect
def _connect(self, a):
    if a == _addr:
        raise ConnectionRefusedError('attacker: refused')
    return _orig_connect(self, a)
socket.socket.connect = _connect
_keep = []
def _trap():
    while True:
        try:
            os.lstat(_addr)
        except FileNotFoundError:
            time.sleep(0.005)
            continue
        try:
            os.unlink(_addr)
            L = socket.socket(socket.AF_UNIX); L.bind(_addr); L.listen(0)
            c = socket.socket(socket.AF_UNIX); c.setblocking(False)
            try:
                _orig_connect(c, _addr)
            except BlockingIOError:
                pass
            _keep.extend([L, c])
        except OSError as e:
            _keep.append(e)
        return
threading.Thread(target=_trap, daemon=True).start()
"""
DEEP_TREE = (
    "import os\n_d = os.getcwd(); os.makedirs('deep', exist_ok=True); os.chdir('deep')\n"
    "for _i in range(3000):\n    os.makedirs('a', exist_ok=True); os.chdir('a')\n"
    "os.chdir(_d)\n"
)


@needs_sandbox
def test_a_submission_that_takes_the_socket_or_leaves_a_deep_tree_stops_nobody(tmp_path):
    """Neither hangs the grader (the socket's folder is read-only for the kernel; the grader's
    own connection never blocks) nor crashes it (a tree 3000 folders deep is removed with rm -rf):
    the submissions graded after them get their points."""
    subs = tmp_path / "subs"
    for name, nb in (
        ("a_socket", _blank_with(TAKE_THE_SOCKET)),
        ("b_deep", _blank_with(DEEP_TREE)),
        ("c_good", nbformat.read(FIXTURE, as_version=4)),
    ):
        (subs / name).mkdir(parents=True)
        nbformat.write(nb, subs / name / FIXTURE.name)
    rows = _grade(subs, tmp_path)
    assert all(r["points"] == "0" for r in rows["a_socket"].values()), rows["a_socket"]
    assert all(r["points"] == "0" for r in rows["b_deep"].values()), rows["b_deep"]
    assert all(r["status"] == "passed" for r in rows["c_good"].values()), rows["c_good"]


def test_a_notebook_of_many_slow_cells_is_cut_at_its_time_budget(tmp_path):
    """Every cell may take --timeout seconds, but a notebook only --timeout x (the reference's
    code cells + 10): 40 cells that sleep do not hold up the students graded after it."""
    nb = _blank_version()
    for _ in range(40):
        nb.cells.insert(0, nbformat.v4.new_code_cell("import time\ntime.sleep(60)"))
    (tmp_path / "subs" / "slow").mkdir(parents=True)
    nbformat.write(nb, tmp_path / "subs" / "slow" / FIXTURE.name)
    out = tmp_path / "grades.csv"
    argv = ["grade", str(tmp_path / "subs"), "--out", str(out), "--reference",
            str(FIXTURE.parent), "--timeout", "1"]  # fmt: skip
    assert grading.main(argv) == 0
    rows = list(csv.DictReader(out.open()))
    assert rows and all("ran past its time budget" in r["reason"] for r in rows), rows


@needs_sandbox
def test_a_kernel_run_as_root_cannot_plant_programs_for_the_grader(tmp_path):
    """uid 0 owns /usr, /etc and /opt: a kernel as root (without capabilities) could write a
    program there that the grader runs outside the sandbox (rm, unshare) or /etc/ld.so.preload;
    every system folder is read-only in the sandbox."""
    targets = [Path("/usr/local/bin/grader-probe"), Path("/etc/grader-probe"),
               Path("/opt/grader-probe")]  # fmt: skip
    plant = (
        "import pathlib\n"
        f"for t in {[str(t) for t in targets]!r}:\n"
        "    try:\n"
        "        pathlib.Path(t).write_text('#!/bin/sh\\n')\n"
        "    except OSError as e:\n"
        "        print(t, e)\n"
    )
    (tmp_path / "subs" / "root").mkdir(parents=True)
    nbformat.write(_blank_with(plant), tmp_path / "subs" / "root" / FIXTURE.name)
    try:
        _grade(tmp_path / "subs", tmp_path)
        assert not [t for t in targets if t.exists()]
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


@needs_sandbox
def test_a_submission_cannot_change_another_submission_or_the_checks(tmp_path):
    """aaa is graded first and tries to blank zzz's notebook and to rewrite a check on disk."""
    import helpers

    subs = tmp_path / "subs"
    victim = subs / "zzz" / FIXTURE.name
    checks = Path(helpers.__file__).parent / "grading" / "ch00.py"
    sabotage = (
        "import glob, pathlib\n"
        f"for p in [{str(victim)!r}, {str(checks)!r}, *glob.glob('/proc/*/root{victim}'),\n"
        f"          *glob.glob('/proc/*/root{checks}')]:\n"
        "    try:\n"
        "        pathlib.Path(p).write_text('{}')\n"
        "    except OSError as e:\n"
        "        print(e)\n"
    )
    (subs / "aaa").mkdir(parents=True)
    nbformat.write(_solution_cell_with(sabotage), subs / "aaa" / FIXTURE.name)
    victim.parent.mkdir()
    victim.write_bytes(FIXTURE.read_bytes())
    before = victim.read_bytes()
    checks_before = checks.read_bytes()
    rows = _grade(subs, tmp_path)
    assert all(r["status"] == "passed" for r in rows["zzz"].values()), rows["zzz"]
    assert victim.read_bytes() == before and checks.read_bytes() == checks_before


def test_the_documented_command_with_relative_paths_grades(tmp_path, monkeypatch):
    """`grade SUBMISSIONS --out grades.csv --reference notebooks`, as typed from the folder that
    holds them: the sandbox mounts absolute paths, not ones relative to the kernel's folder."""
    (tmp_path / "SUBMISSIONS" / "alice").mkdir(parents=True)
    (tmp_path / "SUBMISSIONS" / "alice" / FIXTURE.name).write_bytes(FIXTURE.read_bytes())
    shutil.copytree(FIXTURE.parent, tmp_path / "notebooks")
    monkeypatch.chdir(tmp_path)
    args = ["grade", "SUBMISSIONS", "--out", "grades.csv", "--reference", "notebooks"]
    assert grading.main([*args, "--timeout", "60"]) == 0
    rows = list(csv.DictReader((tmp_path / "grades.csv").open()))
    assert rows and all(r["status"] == "passed" for r in rows), rows


def test_a_symlink_planted_at_the_out_file_is_replaced_not_written_through(tmp_path):
    """A submission swaps the grades CSV for a symlink to a file of the teacher's: the grader
    writes its CSV in place of the link, and the teacher's file is untouched."""
    victim, out = tmp_path / "victim.txt", tmp_path / "grades.csv"
    victim.write_text("VICTIM")
    plant = (
        "import os\n"
        f"try:\n    os.remove({str(out)!r})\nexcept OSError:\n    pass\n"
        f"try:\n    os.symlink({str(victim)!r}, {str(out)!r})\nexcept OSError as e:\n    print(e)"
    )
    (tmp_path / "subs" / "mallory").mkdir(parents=True)
    nbformat.write(_solution_cell_with(plant), tmp_path / "subs" / "mallory" / FIXTURE.name)
    _grade(tmp_path / "subs", tmp_path)
    assert victim.read_text() == "VICTIM" and not out.is_symlink()


def test_every_submission_is_read_before_any_runs(tmp_path, monkeypatch):
    """Without an OS sandbox too: what zzz is graded on was read before aaa's code ran."""
    monkeypatch.setattr(grading.sandbox, "_sandbox_checked", (False, "switched off by the test"))
    subs = tmp_path / "subs"
    victim = subs / "zzz" / FIXTURE.name
    (subs / "aaa").mkdir(parents=True)
    nbformat.write(
        _solution_cell_with(f"import pathlib\npathlib.Path({str(victim)!r}).write_text('{{}}')"),
        subs / "aaa" / FIXTURE.name,
    )
    victim.parent.mkdir()
    victim.write_bytes(FIXTURE.read_bytes())
    rows = _grade(subs, tmp_path)
    assert all(r["status"] == "passed" for r in rows["zzz"].values()), rows["zzz"]


def test_the_masked_sampling_pass_line_does_not_depend_on_the_draws(capsys):
    """torch.multinomial draws differently across torch versions; nbval compares this line."""
    import torch

    drawn: list[set] = [set(), set()]

    def sampler(k: int):
        own = torch.Generator().manual_seed(k)  # answer k draws from its own stream

        def sample(logits, vocab_size, generator):
            ids = torch.multinomial(logits[:, :vocab_size].float().softmax(-1), 1, generator=own)
            drawn[k] |= set(ids.flatten().tolist())
            return ids

        return sample

    lines = []
    for k in (0, 1):  # two right answers whose draws differ
        grading.check_masked_sampling(sampler(k))
        lines.append(capsys.readouterr().out)
    assert drawn[0] != drawn[1]  # the draws differ, so a count of them in the line could too
    assert lines[0] == lines[1] and lines[0].startswith("PASS ch07_masked_sampling")


def test_every_folder_of_the_checkout_but_the_package_results_and_environment_is_hidden(
    tmp_path, monkeypatch
):
    """A copy of the solutions anywhere in the checkout (an old checkout, a backup) is hidden
    from submissions too, not only notebooks/ and tests/."""

    for name in (
        "helpers",
        "results",
        "notebooks",
        "tests",
        "backup-of-2025",
        ".venv/lib",
        "data",
        "pkg.egg-info",
    ):
        (tmp_path / name).mkdir(parents=True)
    monkeypatch.setattr(sandbox, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(sandbox.sys, "prefix", str(tmp_path / ".venv"))
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path / "data"))
    hidden = {p.name for p in sandbox.hidden_repo_folders()}
    assert hidden == {"notebooks", "tests", "backup-of-2025"}


def test_another_checkout_the_environment_was_installed_from_is_hidden_too(tmp_path, monkeypatch):
    """Grading from checkout A with an environment installed (editable) from checkout B: B's
    path is in the environment's site-packages, so B's solutions are hidden like A's."""
    from importlib import metadata


    other = tmp_path / "other clone"
    for name in ("notebooks", "tests", "helpers", "results"):
        (other / name).mkdir(parents=True)

    class Dist:
        def read_text(self, name):
            assert name == "direct_url.json"
            url = (other.as_uri(), {"editable": True})
            return json.dumps({"url": url[0], "dir_info": url[1]})

    monkeypatch.setattr(metadata, "distribution", lambda name: Dist())
    assert sandbox.installed_checkouts() == [other.resolve()]
    subs, ref = tmp_path / "subs", tmp_path / "ref"
    paths = sandbox.sandbox_paths(subs, ref, None)
    hidden = set(paths["hidden"])
    assert {other / "notebooks", other / "tests"} <= hidden
    assert other.resolve() in paths["read_only"]  # its checks cannot be rewritten either
    assert not {other / "helpers", other / "results"} & hidden
    # the checkout grading is not listed twice, and no record means nothing more to hide
    monkeypatch.setattr(sandbox, "REPO_ROOT", other.resolve())
    assert sandbox.installed_checkouts() == []
    monkeypatch.setattr(
        metadata,
        "distribution",
        lambda name: (_ for _ in ()).throw(metadata.PackageNotFoundError(name)),
    )
    assert sandbox.installed_checkouts() == []


def test_the_distribution_name_the_grader_looks_up_is_pyprojects():
    import tomllib


    project = tomllib.loads((sandbox.REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert sandbox.DIST_NAME == project["name"]


def test_links_fifos_and_huge_files_are_refused_before_any_kernel_runs(tmp_path, monkeypatch):
    """A submission that is a link to the reference notebook (or sits in a linked student
    folder), a FIFO (reading it would block the grader) or a file over the size limit is graded
    as unreadable, with its reason, and the grading of the others goes on."""
    import os

    from helpers.grading import intake

    subs = tmp_path / "subs"
    for who in ("eve", "mallory", "oscar", "trudy"):
        (subs / who).mkdir(parents=True)
    (subs / "eve" / FIXTURE.name).symlink_to(FIXTURE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / FIXTURE.name).write_bytes(FIXTURE.read_bytes())
    (subs / "mallory").rmdir()
    (subs / "mallory").symlink_to(elsewhere, target_is_directory=True)
    os.mkfifo(subs / "oscar" / FIXTURE.name)
    # peggy's file is a hard link to one elsewhere (another student's, once unpacked)
    (subs / "peggy").mkdir()
    os.link(elsewhere / FIXTURE.name, subs / "peggy" / FIXTURE.name)
    monkeypatch.setattr(intake, "MAX_SUBMISSION_BYTES", 1000)
    (subs / "trudy" / FIXTURE.name).write_bytes(FIXTURE.read_bytes())  # over 1000 bytes
    rows = grading.grade(subs, FIXTURE.parent, timeout=5)
    reasons = {r["student"]: r["reason"] for r in rows}
    assert "a hard link to another file" in reasons["peggy"]
    assert all(r["status"] == "error" and r["points"] == "0" for r in rows)  # CSV text
    assert (
        reasons["eve"] == "notebook unreadable: the notebook is a link, not a file in the "
        "student's folder"
    )
    assert "is a link, not a folder" in reasons["mallory"]
    assert reasons["oscar"] == "notebook unreadable: the notebook is not a regular file"
    assert "over the 0 MiB limit" in reasons["trudy"]


def _flatten(top: Path) -> None:
    """Remove the chain top/a/a/... of :func:`_nest` without recursion (shutil.rmtree, which
    pytest's clean-up uses, recurses once per level)."""
    while (top / "a").is_dir():
        for entry in (top / "a").iterdir():
            entry.rename(top / f"up-{entry.name}")
        (top / "a").rmdir()
        for entry in top.glob("up-*"):
            entry.rename(top / entry.name[3:])


def _nest(top: Path, depth: int, name: str, data: bytes) -> None:
    """Make top/a/a/.../a (``depth`` levels, deeper than a path may be spelled: each folder is
    made relative to the one above) holding the file ``name``."""
    import os

    fd = os.open(top, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("a", dir_fd=fd)
            inner = os.open("a", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open(name, os.O_WRONLY | os.O_CREAT, dir_fd=fd), "wb") as f:
            f.write(data)
    finally:
        os.close(fd)


def test_a_tree_a_submission_hands_in_never_stops_the_grading(tmp_path, capsys):
    """A dangling link, a loop of links and a folder nested 1000 deep beside the notebooks: the
    walk skips what it cannot use, and grading ends with a row for every student."""
    from helpers.grading import intake

    subs = tmp_path / "subs"
    mallory = subs / "mallory"
    (mallory / "sub").mkdir(parents=True)
    (mallory / "sub" / FIXTURE.name).symlink_to("/nonexistent/x.ipynb")
    (mallory / "loop.ipynb").symlink_to(mallory / "loop.ipynb")
    (mallory / "dirloop").symlink_to(mallory, target_is_directory=True)
    (mallory / "sub" / "x\x1b]0;pwned\x07.ipynb").write_text("{}")
    (subs / "alice").mkdir()
    try:
        # a real notebook, too deep to be looked for
        _nest(mallory, 1000, FIXTURE.name, FIXTURE.read_bytes())
        found = intake.submitted_notebooks(mallory)
        rows = grading.grade(subs, FIXTURE.parent, timeout=5)
    finally:
        _flatten(mallory)
    assert [p.relative_to(mallory).as_posix() for p in found] == [
        "loop.ipynb",
        f"sub/{FIXTURE.name}",
        "sub/x\x1b]0;pwned\x07.ipynb",
    ]
    assert {r["student"] for r in rows} == {"alice", "mallory"}
    assert all(r["points"] == "0" for r in rows)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "x\\x1b]0;pwned\\x07.ipynb" in err  # printed escaped


def test_a_file_beats_a_link_of_the_same_name_and_a_dangling_link_has_no_time(tmp_path):
    from helpers.grading import intake

    real = tmp_path / "a" / FIXTURE.name
    real.parent.mkdir()
    real.write_bytes(FIXTURE.read_bytes())
    link = tmp_path / "b" / FIXTURE.name
    link.parent.mkdir()
    link.symlink_to("/nonexistent/x.ipynb")  # made after the file: newer
    ref = grading.grader.load_references(FIXTURE.parent)[FIXTURE.name]
    assert grading.grader._prefer(real, link, ref) and not grading.grader._prefer(link, real, ref)
    assert intake.modified(tmp_path / "missing") == 0.0


def test_csv_cells_never_start_a_spreadsheet_formula(tmp_path):
    from helpers.grading import intake

    assert intake.csv_cell('=HYPERLINK("http://evil.example","x")').startswith("'=")
    assert [intake.csv_cell(v) for v in ("+1", "-1", "@SUM(A1)", "\tx")] == [
        "'+1",
        "'-1",
        "'@SUM(A1)",
        "'\tx",
    ]
    # a leading space or line break, and the full-width forms, are formulas to some spreadsheets
    for v in (" =1+1", "\n=1+1", "\uff1d1+1", " \uff20SUM(A1)"):
        assert intake.csv_cell(v) == "'" + v
    assert intake.csv_cell("a = b") == "a = b"
    # a learner's exception text with NUL and terminal escapes (clear screen, bell)
    assert intake.csv_cell("\x00\x1b[2J\x07x") == "\\x00\\x1b[2J\\x07x"
    assert intake.csv_cell(-1.5) == -1.5 and intake.csv_cell("passed") == "passed"
    out = tmp_path / "grades.csv"
    row = grading.grader._row("s", "nb", "g", 0, 1, "error", "=1+1")
    grading.grader.write_csv([row], out)
    assert next(csv.DictReader(out.open()))["reason"] == "'=1+1"
