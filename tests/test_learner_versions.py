"""The committed learner versions (learner/) are exactly what make-student writes from notebooks/,
with the solutions stubbed and the recorded outputs of every cell outside an exercise kept."""

import nbformat

from helpers import REPO_ROOT
from helpers.grading import student

NOTEBOOKS, LEARNER = REPO_ROOT / "notebooks", REPO_ROOT / "learner"
REGENERATE = "python -m helpers.grading make-student notebooks --out learner --keep-outputs"


def test_committed_learner_versions_are_what_make_student_writes_now(tmp_path, capsys):
    written = student.make_student(NOTEBOOKS, tmp_path, keep_outputs=True)
    assert written, "no learner version was written"
    committed = sorted(p.name for p in LEARNER.glob("*.ipynb"))
    assert committed == sorted(p.name for p in written), f"learner/ is stale: run {REGENERATE}"
    for path in written:
        fresh = nbformat.read(path, as_version=4)
        assert nbformat.read(LEARNER / path.name, as_version=4) == fresh, (
            f"learner/{path.name} differs from its solution notebook's student version: "
            f"run {REGENERATE}"
        )


def test_learner_versions_keep_measurements_and_hide_every_answer():
    for path in sorted(LEARNER.glob("*.ipynb")):
        solution = nbformat.read(NOTEBOOKS / path.name, as_version=4)
        learner = nbformat.read(path, as_version=4)
        for ours, theirs in zip(solution.cells, learner.cells, strict=True):
            if ours.cell_type != "code":
                continue
            if student.is_exercise_cell(ours):
                assert theirs.outputs == [] and "BEGIN SOLUTION" not in theirs.source, path.name
            else:
                assert theirs.outputs == ours.outputs, path.name  # the recorded numbers stay
        kept = sum(bool(c.get("outputs")) for c in learner.cells)
        assert kept, f"{path.name}: a self-learner would see no recorded output"


def test_without_keep_outputs_every_output_is_cleared():
    nb = nbformat.read(NOTEBOOKS / "01_fp32_baseline.ipynb", as_version=4)
    blank = student.student_version(nb)
    assert all(not c.get("outputs") for c in blank.cells) and "widgets" not in blank.metadata
    kept = student.student_version(nb, keep_outputs=True)
    assert any(c.get("outputs") for c in kept.cells)
