"""Tests for helpers/grading.py: the checks, student versions, and grading of submissions."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers import grading

FIXTURE = Path(__file__).parent / "fixtures" / "grading_demo.ipynb"
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


# ---- the right answers, written independently of the checks -------------------------------------


def matmul_flops(M: int, N: int, K: int) -> int:
    return 2 * M * N * K


def achieved_tflops(flops: float, ms: float) -> float:
    return flops / (ms / 1e3) / 1e12


def expected_initial_loss(vocab_size: int) -> float:
    return math.log(vocab_size)


def block_parameters(n_embd: int) -> int:
    return 12 * n_embd * n_embd + 13 * n_embd


def time_steps(step, synchronize, warmup, iters):
    import time

    for _ in range(warmup):
        step()
    synchronize()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        synchronize()
        out.append(1e3 * (time.perf_counter() - t0))
    return out


def mfu(step_ms, tokens_per_step, flops_per_token, peak_flops):
    return flops_per_token * tokens_per_step / (step_ms / 1e3) / peak_flops


def adamw_state_bytes(n_params):
    return 8 * n_params


def find_max_batch(try_step, start=1):
    from helpers import memory

    return memory.find_max_batch_size(try_step, "cpu", start=start)["max_batch_size"]


def causal_attention(q, k, v):
    import torch

    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def combine_two_tiles(s1, v1, s2, v2):
    import torch

    m1 = s1.amax(dim=1, keepdim=True)
    m = torch.maximum(m1, s2.amax(dim=1, keepdim=True))
    p1, p2 = torch.exp(s1 - m), torch.exp(s2 - m)
    return (p1 @ v1 + p2 @ v2) / (p1.sum(1, keepdim=True) + p2.sum(1, keepdim=True))


def pad_vocab(n, multiple):
    return -(-n // multiple) * multiple


def sample_next(logits, vocab_size, generator):
    import torch

    return torch.multinomial(logits[:, :vocab_size].float().softmax(-1), 1, generator=generator)


def autocast_step(model, optimizer, x, y, dtype, scaler=None):
    import torch

    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=dtype):
        logits, loss = model(x, y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return logits, loss


def pick_autocast_dtype(capability):
    import torch

    if capability is None:
        return torch.bfloat16
    return torch.bfloat16 if capability >= (8, 0) else torch.float16


RIGHT_ANSWERS = {
    "ch00_matmul_flops": matmul_flops,
    "ch00_tflops": achieved_tflops,
    "ch01_loss_at_init": expected_initial_loss,
    "ch01_block_params": block_parameters,
    "ch02_step_timer": time_steps,
    "ch02_mfu": mfu,
    "ch03_adamw_bytes": adamw_state_bytes,
    "ch03_batch_probe": find_max_batch,
    "ch04_autocast_step": autocast_step,
    "ch04_autocast_dtype": pick_autocast_dtype,
    "ch06_sdpa_attention": causal_attention,
    "ch06_online_softmax": combine_two_tiles,
    "ch07_pad_vocab": pad_vocab,
    "ch07_masked_sampling": sample_next,
}


def _chapter_right_answers() -> dict:
    """Right answers of the chapters whose checks live in helpers/checks_chNN.py: each chapter has
    tests/answers_chNN.py defining RIGHT_ANSWERS (kept out of the package students install)."""
    import importlib.util

    found = {}
    for path in sorted(Path(__file__).parent.glob("answers_ch*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found.update(module.RIGHT_ANSWERS)
    return found


RIGHT_ANSWERS.update(_chapter_right_answers())


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
    assert len(out) == 1 and out[0].startswith(f"PASS {grade_id}:")


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
    from helpers.model import Block, GPTConfig

    block = Block(GPTConfig(n_embd=64, n_head=4, block_size=8))
    assert grading.measured_block_parameters(64, 4) == sum(p.numel() for p in block.parameters())


@pytest.mark.parametrize(
    "grade_id,wrong,words",
    [
        ("ch00_matmul_flops", grading._flops_forgot_add, "adds"),
        ("ch00_matmul_flops", grading._flops_no_return, "return"),
        ("ch00_tflops", grading._tflops_forgot_ms_to_s, "divide ms by 1e3"),
        ("ch00_tflops", grading._tflops_forgot_tera, "1e12"),
        ("ch01_loss_at_init", grading._loss_log10, "natural log"),
        ("ch01_loss_at_init", grading._loss_log2, "nats"),
        ("ch01_loss_at_init", grading._loss_probability, "probability"),
        ("ch01_block_params", grading._block_weights_only, "biases"),
        ("ch01_block_params", grading._block_forgot_layernorm, "LayerNorm"),
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
    # the check was restored from the reference (the student replaced it by `pass`): it still passes,
    # and scores the reference's 1 point, not the student's 100.
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
    assert rows == [grading._row("frank", "", "", 0, 0, "missing", "no notebook submitted")]


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

    # (b) executed, it fails the graded cells, only those, only as "not attempted" or a hint,
    # and the kernel survives to the last cell
    run = grading.execute_notebook(student, cwd=path.parent, timeout=600)
    assert (
        run.startup_error is None
        and run.kernel_died_in is None
        and run.stuck_after_timeout_in is None
    )
    graded_cells = {index for index, _ in grading.check_cells(student).values()}
    problems = []
    for index, cell in run.cells.items():
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
    assert not problems, "\n".join(problems)


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
    text = (tmp_path / "cheat" / FIXTURE.name).read_text().replace("return 2 * multiply_adds", "return 0")
    (tmp_path / "cheat" / FIXTURE.name).write_text(text)
    out = tmp_path / "grades.csv"
    assert grading.main(["grade", str(tmp_path), "--out", str(out), "--reference", str(FIXTURE.parent), "--timeout", "60"]) == 0
    rows = {r["grade_id"]: r for r in csv.DictReader(out.open())}
    assert rows["ch00_matmul_flops"]["status"] == "failed"


def test_chapter_check_modules_are_merged_and_reloaded(tmp_path, monkeypatch):
    import importlib

    import helpers

    (tmp_path / "checks_ch99.py").write_text(
        "SECTIONS = {'ch99_demo': 'chapter 99, section 1 (Demo)'}\n"
        "def check_demo(fn):\n    assert fn() == 1, 'Reread chapter 99.'\n    print('PASS ch99_demo: ok')\n"
        "CHECKS = {'ch99_demo': check_demo}\n"
        "WRONG_ANSWERS = {'ch99_demo': [lambda: 2]}\n"
    )
    monkeypatch.setattr(helpers, "__path__", [*helpers.__path__, str(tmp_path)])
    try:
        fresh = importlib.reload(grading)
        assert fresh.CHECKS["ch99_demo"] is fresh.check_demo and "ch99_demo" in fresh.SECTIONS
        sys.modules["helpers.checks_ch99"].check_demo = lambda fn: None  # a submission patches it
        fresh = importlib.reload(grading)  # the grader's fresh import undoes the patch
        with pytest.raises(AssertionError):
            fresh.CHECKS["ch99_demo"](lambda: 2)
        (tmp_path / "checks_ch98.py").write_text(
            "SECTIONS = {'ch99_demo': 'x'}\nCHECKS = {'ch99_demo': print}\nWRONG_ANSWERS = {'ch99_demo': []}\n"
        )
        with pytest.raises(RuntimeError, match="redefines grade ids"):
            importlib.reload(grading)
    finally:
        monkeypatch.undo()
        sys.modules.pop("helpers.checks_ch99", None)
        sys.modules.pop("helpers.checks_ch98", None)
        importlib.reload(grading)
    assert "ch99_demo" not in grading.CHECKS
