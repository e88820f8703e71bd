"""Graded exercises: the checks learners call, and the teacher's tools around them.

Three parts, one idea each:

1. **Checks** (``check_matmul_flops`` ...): run the learner's function on small CPU inputs, print one
   ``PASS ...`` line, or raise ``AssertionError`` whose first line says what is wrong and which
   section to reread. ``CHECKS`` maps each nbgrader ``grade_id`` to its check; ``WRONG_ANSWERS``
   holds plausible mistakes that each check must reject (the tests use them).
2. **Student versions** (``python -m helpers.grading make-student``): nbgrader's notebook format
   (schema 3, ``### BEGIN SOLUTION`` / ``### END SOLUTION`` markers), solutions replaced by a stub,
   outputs cleared. nbgrader itself is not needed.
3. **Grading** (``python -m helpers.grading grade``): every submission runs in a fresh kernel; a
   check cell scores its points (taken from the reference notebook) when it runs without error.

nbgrader's format: https://nbgrader.readthedocs.io/en/stable/user_guide/creating_and_grading_assignments.html
Teacher guide with the exact commands: docs/grading.md.
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------------------------
# 1. Checks
# --------------------------------------------------------------------------------------------

# Where each exercise is explained: the hint of a failed check points there. One place to edit
# when a chapter's sections are renumbered.
SECTIONS = {
    "ch00_matmul_flops": "chapter 00, section 2 (Counting the FLOPs of a matmul)",
    "ch00_tflops": "chapter 00, section 3 (From FLOPs and milliseconds to TFLOP/s)",
    "ch01_loss_at_init": "chapter 01, section 4 (The loss before training)",
    "ch01_block_params": "chapter 01, section 2 (Where the parameters are)",
}


def _reread(grade_id: str) -> str:
    return f"Reread {SECTIONS[grade_id]}."


def _as_number(value: Any, call: str, grade_id: str) -> float:
    """``float(value)``, or an AssertionError that says the learner's function returned no number."""
    if value is None:
        raise AssertionError(
            f"{call} returned None: the function needs a `return` statement. {_reread(grade_id)}"
        )
    if isinstance(value, bool):
        raise AssertionError(
            f"{call} returned a bool ({value}), expected a number. {_reread(grade_id)}"
        )
    try:
        return float(value)  # int, float, numpy scalar, 0-d torch tensor
    except (TypeError, ValueError):
        raise AssertionError(
            f"{call} returned {type(value).__name__} {value!r}, expected a number. {_reread(grade_id)}"
        ) from None


def _close(a: float, b: float, rel: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


MATMUL_SHAPES = [(2, 3, 4), (7, 1, 5), (64, 128, 32), (1024, 768, 3072)]  # (M, N, K), non-square


def check_matmul_flops(fn: Callable[[int, int, int], int]) -> None:
    """Check ``matmul_flops(M, N, K) -> int``: FLOPs of (M, K) @ (K, N), which is ``2*M*N*K``.

    Each of the M*N outputs is a dot product of length K: K multiplies and K adds, counted as
    2 FLOPs per multiply-add (the convention of GPU datasheets and of Kaplan et al. 2020, §2.1).

    Raises:
        AssertionError: with a hint, when any shape gives a different count.
    """
    gid = "ch00_matmul_flops"
    for M, N, K in MATMUL_SHAPES:
        call = f"matmul_flops({M}, {N}, {K})"
        got = _as_number(fn(M, N, K), call, gid)
        want = 2 * M * N * K
        if got == want:
            continue
        if got == M * N * K:
            why = (
                f"{call} returned {got:,.0f} = M*N*K: you counted the multiplies but not the adds. "
                "Each multiply-add is 2 FLOPs."
            )
        elif got in (2 * M * N, 2 * M * K, 2 * N * K):
            why = f"{call} returned {got:,.0f}: one of M, N, K is missing from your product."
        else:
            why = (
                f"{call} returned {got:,.0f}, expected {want:,} for A of shape (M, K) = ({M}, {K}) "
                f"times B of shape (K, N) = ({K}, {N})."
            )
        raise AssertionError(f"{why} {_reread(gid)}")
    print(
        f"PASS {gid}: matmul_flops(M, N, K) == 2*M*N*K for {len(MATMUL_SHAPES)} non-square shapes"
    )


TFLOPS_CASES = [(2 * 4096**3, 1.0), (1e12, 1000.0), (3.5e14, 2.5), (1e9, 0.01)]  # (flops, ms)


def check_tflops(fn: Callable[[float, float], float]) -> None:
    """Check ``achieved_tflops(flops, ms) -> float``: ``flops / (ms / 1e3) / 1e12`` TFLOP/s.

    Raises:
        AssertionError: with a hint, when a case differs by more than a relative 1e-6.
    """
    gid = "ch00_tflops"
    for flops, ms in TFLOPS_CASES:
        call = f"achieved_tflops({flops:g}, {ms:g})"
        got = _as_number(fn(flops, ms), call, gid)
        want = flops / (ms / 1e3) / 1e12
        if _close(got, want):
            continue
        if _close(got, want / 1e3):
            why = f"{call} returned {got:g}, 1000x too small: ms are milliseconds, divide ms by 1e3 to get seconds."
        elif _close(got, want / 1e6):
            why = f"{call} returned {got:g}, 1e6x too small: milliseconds to seconds is ms / 1e3, not ms * 1e3."
        elif _close(got, want * 1e12):
            why = f"{call} returned {got:g}: that is FLOP/s; divide by 1e12 to get TFLOP/s."
        elif _close(got, want * 1e9):
            why = f"{call} returned {got:g}: that is FLOP/ms; convert ms to s and divide by 1e12."
        elif got > 0 and _close(1.0 / got, want):
            why = f"{call} returned {got:g}: the time goes in the denominator (FLOPs per second)."
        else:
            why = f"{call} returned {got:g}, expected {want:g} TFLOP/s."
        raise AssertionError(f"{why} {_reread(gid)}")
    print(
        f"PASS {gid}: achieved_tflops(flops, ms) == flops / (ms/1e3) / 1e12 for {len(TFLOPS_CASES)} cases"
    )


VOCAB_SIZES = [2, 65, 1000, 50257, 50304]


def check_loss_at_init(fn: Callable[[int], float]) -> None:
    """Check ``expected_initial_loss(vocab_size) -> float``: ``ln(vocab_size)`` nats.

    A model that spreads probability evenly gives every target ``p = 1/V``; cross-entropy is
    ``-ln(p) = ln(V)`` (natural log, as ``F.cross_entropy`` uses). For GPT-2, ln(50257) ≈ 10.825.

    Raises:
        AssertionError: with a hint, when a vocabulary size differs by more than 1e-4.
    """
    gid = "ch01_loss_at_init"
    for V in VOCAB_SIZES:
        call = f"expected_initial_loss({V})"
        got = _as_number(fn(V), call, gid)
        want = math.log(V)
        if abs(got - want) <= 1e-4:
            continue
        if abs(got - math.log10(V)) <= 1e-4:
            why = f"{call} returned {got:.4f} = log10(V): cross-entropy uses the natural log (math.log)."
        elif abs(got - math.log2(V)) <= 1e-4:
            why = f"{call} returned {got:.4f} = log2(V), in bits: PyTorch's cross-entropy is in nats (math.log)."
        elif abs(got - 1.0 / V) <= 1e-6:
            why = f"{call} returned {got:.6f} = 1/V: that is the probability of the target, not the loss -ln(p)."
        elif abs(got + want) <= 1e-4:
            why = (
                f"{call} returned {got:.4f}: the loss is -ln(p), a positive number; check the sign."
            )
        else:
            why = f"{call} returned {got:.4f}, expected {want:.4f} nats."
        raise AssertionError(f"{why} {_reread(gid)}")
    print(f"PASS {gid}: expected_initial_loss(V) == ln(V) for V in {VOCAB_SIZES}")


BLOCK_WIDTHS = [(64, 4), (96, 3), (128, 8), (768, 12)]  # (n_embd, n_head), n_head divides n_embd


def measured_block_parameters(n_embd: int, n_head: int) -> int:
    """Parameters of one ``helpers.model.Block``, counted on the real module (sum of numel)."""
    from helpers.model import Block, GPTConfig  # torch is imported only when this check runs

    block = Block(GPTConfig(n_embd=n_embd, n_head=n_head, block_size=8))
    return sum(p.numel() for p in block.parameters())


def check_block_params(fn: Callable[[int], int]) -> None:
    """Check ``block_parameters(n_embd) -> int`` against a real ``helpers.model.Block``.

    The expected count is measured, not written down: each width builds a Block and sums
    ``p.numel()`` over its parameters (buffers such as the causal mask are not parameters).

    Raises:
        AssertionError: with a hint, when a width gives a different count.
    """
    gid = "ch01_block_params"
    for C, n_head in BLOCK_WIDTHS:
        call = f"block_parameters({C})"
        got = _as_number(fn(C), call, gid)
        want = measured_block_parameters(C, n_head)
        if got == want:
            continue
        weights = 12 * C * C  # the matrices of attention (4 C^2) and MLP (8 C^2)
        missing = want - got
        if got == weights:
            why = (
                f"{call} returned {got:,.0f}: you counted the weight matrices, but no biases and no "
                "LayerNorm parameters. Every nn.Linear here has a bias; each nn.LayerNorm has a weight and a bias."
            )
        elif missing == 4 * C:
            why = f"{call} returned {got:,.0f}, {missing:,.0f} short: the two LayerNorms each have a weight and a bias of size C."
        elif missing == 2 * C:
            why = f"{call} returned {got:,.0f}, {missing:,.0f} short: a LayerNorm has a bias as well as a weight, and a Block has two LayerNorms."
        elif 0 < missing < 13 * C and missing % C == 0:
            why = f"{call} returned {got:,.0f}, {missing:,.0f} = {missing // C}*C short: some biases or LayerNorm parameters are missing."
        elif got in (4 * C * C, 8 * C * C) or abs(missing) >= C * C:
            why = (
                f"{call} returned {got:,.0f}, expected {want:,}: a weight matrix is off. Count c_attn (C -> 3C), "
                "attn.c_proj (C -> C), mlp.c_fc (C -> 4C) and mlp.c_proj (4C -> C)."
            )
        else:
            why = (
                f"{call} returned {got:,.0f}, expected {want:,} (measured on helpers.model.Block)."
            )
        raise AssertionError(f"{why} {_reread(gid)}")
    widths = [C for C, _ in BLOCK_WIDTHS]
    print(f"PASS {gid}: block_parameters(C) matches helpers.model.Block for C in {widths}")


CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = {
    "ch00_matmul_flops": check_matmul_flops,
    "ch00_tflops": check_tflops,
    "ch01_loss_at_init": check_loss_at_init,
    "ch01_block_params": check_block_params,
}


# Plausible mistakes, one function each, named for the mistake. Every check must reject all of
# its list (tests/test_grading.py), so a check that passes anything is caught.
def _flops_forgot_add(M: int, N: int, K: int) -> int:
    return M * N * K


def _flops_forgot_k(M: int, N: int, K: int) -> int:
    return 2 * M * N


def _flops_assumes_square(M: int, N: int, K: int) -> int:
    return 2 * M * M * K


def _flops_no_return(M: int, N: int, K: int) -> None:
    2 * M * N * K  # noqa: B018 - the mistake is the missing return


def _tflops_forgot_ms_to_s(flops: float, ms: float) -> float:
    return flops / ms / 1e12


def _tflops_multiplied_ms(flops: float, ms: float) -> float:
    return flops / (ms * 1e3) / 1e12


def _tflops_forgot_tera(flops: float, ms: float) -> float:
    return flops / (ms / 1e3)


def _tflops_inverted(flops: float, ms: float) -> float:
    return (ms / 1e3) / flops * 1e12


def _loss_log10(vocab_size: int) -> float:
    return math.log10(vocab_size)


def _loss_log2(vocab_size: int) -> float:
    return math.log2(vocab_size)


def _loss_probability(vocab_size: int) -> float:
    return 1.0 / vocab_size


def _loss_negative(vocab_size: int) -> float:
    return -math.log(vocab_size)


def _block_weights_only(n_embd: int) -> int:
    return 12 * n_embd * n_embd


def _block_forgot_layernorm(n_embd: int) -> int:
    return 12 * n_embd * n_embd + 9 * n_embd


def _block_layernorm_without_bias(n_embd: int) -> int:
    return 12 * n_embd * n_embd + 11 * n_embd


def _block_attention_only(n_embd: int) -> int:
    return 4 * n_embd * n_embd + 4 * n_embd + 2 * n_embd


def _block_mlp_hidden_c(n_embd: int) -> int:
    return 6 * n_embd * n_embd + 13 * n_embd


WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch00_matmul_flops": [
        _flops_forgot_add,
        _flops_forgot_k,
        _flops_assumes_square,
        _flops_no_return,
    ],
    "ch00_tflops": [
        _tflops_forgot_ms_to_s,
        _tflops_multiplied_ms,
        _tflops_forgot_tera,
        _tflops_inverted,
    ],
    "ch01_loss_at_init": [_loss_log10, _loss_log2, _loss_probability, _loss_negative],
    "ch01_block_params": [
        _block_weights_only,
        _block_forgot_layernorm,
        _block_layernorm_without_bias,
        _block_attention_only,
        _block_mlp_hidden_c,
    ],
}


# --------------------------------------------------------------------------------------------
# 2. nbgrader's notebook format and student versions
# --------------------------------------------------------------------------------------------

CODE_STUB = '# YOUR CODE HERE\nraise NotImplementedError("Write this function: see the exercise text above")'
TEXT_STUB = "YOUR ANSWER HERE"
_BEGIN = re.compile(r"^\s*#+\s*BEGIN SOLUTION\b")
_END = re.compile(r"^\s*#+\s*END SOLUTION\b")
_BEGIN_HIDDEN = re.compile(r"^\s*#+\s*BEGIN HIDDEN TESTS\b")
_END_HIDDEN = re.compile(r"^\s*#+\s*END HIDDEN TESTS\b")


class SolutionMarkerError(ValueError):
    """A notebook's ``BEGIN SOLUTION`` / ``END SOLUTION`` markers do not pair up."""


def nbgrader_metadata(cell: Any) -> dict[str, Any]:
    """The cell's ``metadata.nbgrader`` dict (empty when the cell is not an nbgrader cell)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def is_solution_cell(cell: Any) -> bool:
    """True for a cell the learner writes in (``solution: true``)."""
    return bool(nbgrader_metadata(cell).get("solution", False))


def is_check_cell(cell: Any) -> bool:
    """True for an autograded check cell: ``grade: true, solution: false``, a code cell."""
    meta = nbgrader_metadata(cell)
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


def check_cells(nb: Any) -> dict[str, tuple[int, float]]:
    """``{grade_id: (cell index, points)}`` for every check cell of ``nb``, in notebook order."""
    found: dict[str, tuple[int, float]] = {}
    for index, cell in enumerate(nb.cells):
        if is_check_cell(cell):
            meta = nbgrader_metadata(cell)
            found[str(meta.get("grade_id", f"cell-{index}"))] = (
                index,
                float(meta.get("points", 0)),
            )
    return found


def has_exercises(nb: Any) -> bool:
    """True when any cell carries nbgrader metadata or a solution marker."""
    return any(
        nbgrader_metadata(cell) or any(_BEGIN.match(line) for line in cell.source.splitlines())
        for cell in nb.cells
    )


def _where(name: str, index: int, cell: Any) -> str:
    gid = nbgrader_metadata(cell).get("grade_id")
    return f"{name}, cell {index + 1}" + (f" (grade_id {gid!r})" if gid else "")


def _replace_regions(
    lines: list[str], begin: re.Pattern[str], end: re.Pattern[str], stub: str | None, where: str
) -> tuple[list[str], bool]:
    """Replace each begin..end region (markers included) by ``stub`` indented like its begin line.

    ``stub=None`` deletes the region. Returns the new lines and whether any region was found.
    Raises SolutionMarkerError when the markers do not pair up.
    """
    out: list[str] = []
    begin_line: int | None = None
    found = False
    for number, line in enumerate(lines, start=1):
        if begin.match(line):
            if begin_line is not None:
                raise SolutionMarkerError(
                    f"{where}: line {number} opens a region while the one opened on line {begin_line} "
                    f"is still open ({line.strip()!r}). Add the missing END marker."
                )
            begin_line = number
            found = True
            if stub is not None:
                indent = line[: len(line) - len(line.lstrip())]
                out.extend(indent + stub_line for stub_line in stub.splitlines())
        elif end.match(line):
            if begin_line is None:
                raise SolutionMarkerError(
                    f"{where}: line {number} ({line.strip()!r}) closes a region that was never opened. "
                    "Add the missing BEGIN marker or delete this line."
                )
            begin_line = None
        elif begin_line is None:
            out.append(line)
    if begin_line is not None:
        raise SolutionMarkerError(
            f"{where}: the region opened on line {begin_line} is never closed. Add the END marker."
        )
    return out, found


def student_version(nb: Any, name: str = "notebook") -> Any:
    """A copy of ``nb`` as learners get it (nbgrader's ``generate_assignment``, without nbgrader).

    - every ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region becomes ``CODE_STUB`` (code) or
      ``TEXT_STUB`` (markdown), indented like the BEGIN line; a solution cell without markers is
      replaced whole, as nbgrader does;
    - ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` regions are deleted;
    - outputs, execution counts, execution timings and saved widget state are cleared;
    - nbgrader metadata is kept, so the grader can find the check cells.

    Args:
        nb: an nbformat v4 notebook (not modified).
        name: shown in error messages (e.g. the file name).
    Raises:
        SolutionMarkerError: naming the notebook and cell whose markers do not pair up.
    """
    student = copy.deepcopy(nb)
    for index, cell in enumerate(student.cells):
        where = _where(name, index, cell)
        stub = TEXT_STUB if cell.cell_type == "markdown" else CODE_STUB
        lines, replaced = _replace_regions(cell.source.splitlines(), _BEGIN, _END, stub, where)
        lines, _ = _replace_regions(lines, _BEGIN_HIDDEN, _END_HIDDEN, None, where)
        if is_solution_cell(cell) and not replaced:
            lines = stub.splitlines()
        cell.source = "\n".join(lines)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
        if "attachments" in cell and is_solution_cell(cell):
            del cell["attachments"]
    student.metadata.pop("widgets", None)
    return student


def _notebooks_in(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is neither a notebook nor a folder of notebooks.")
    return sorted(p for p in path.glob("*.ipynb") if not p.name.startswith("."))


def make_student(source: Path, out: Path) -> list[Path]:
    """Write the student version of every exercise notebook in ``source`` to ``out``.

    ``source`` is a folder (its ``*.ipynb``, not recursive) or one notebook. Notebooks without any
    nbgrader cell are skipped (said on stdout): they have nothing to hide. Nothing else is copied.

    Returns:
        The written paths.
    Raises:
        FileNotFoundError: when ``source`` does not exist.
        ValueError: when ``out`` is the source folder (it would overwrite the solutions).
        SolutionMarkerError: on unbalanced markers (nothing is written for that notebook).
    """
    import nbformat

    notebooks = _notebooks_in(source)
    source_dir = source if source.is_dir() else source.parent
    if out.resolve() == source_dir.resolve():
        raise ValueError(
            f"--out {out} is the folder of the solution notebooks; choose another folder."
        )
    written = []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        if not has_exercises(nb):
            print(f"skipped {path} (no nbgrader cells)")
            continue
        student = student_version(nb, name=str(path))
        nbformat.validate(student)
        out.mkdir(parents=True, exist_ok=True)
        target = out / path.name
        nbformat.write(student, target)
        print(f"wrote {target} ({len(check_cells(student))} graded cells)")
        written.append(target)
    return written


# --------------------------------------------------------------------------------------------
# 3. Executing notebooks and grading submissions
# --------------------------------------------------------------------------------------------

TIMEOUT_ENAME = "CellTimeoutError"
REPO_ROOT = Path(__file__).resolve().parents[1]  # the folder that holds helpers/


@dataclass
class CellRun:
    """What happened to one code cell: status is ``ok``, ``error``, ``timeout`` or ``not run``."""

    index: int  # 0-based position in the notebook
    status: str
    ename: str = ""
    evalue: str = ""


@dataclass
class NotebookRun:
    """The result of :func:`execute_notebook`: one CellRun per code cell, and kernel events."""

    cells: dict[int, CellRun] = field(default_factory=dict)
    kernel_died_in: int | None = None  # 0-based index of the cell during which the kernel died
    stuck_after_timeout_in: int | None = None  # a timeout the interrupt could not end
    startup_error: str | None = None  # the kernel never started


def _kernel_manager_class() -> type:
    """An AsyncKernelManager that always launches ipykernel with *this* Python interpreter.

    A ``python3`` kernelspec installed elsewhere (another conda env, ~/.local) would otherwise run
    the submissions with a different torch, or without ``helpers``.
    """
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager

    class CurrentPythonKernelManager(AsyncKernelManager):
        @property
        def kernel_spec(self) -> KernelSpec:  # type: ignore[override]
            if self._kernel_spec is None:
                self._kernel_spec = KernelSpec(
                    argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    display_name=f"Python {sys.version_info.major}.{sys.version_info.minor} (grader)",
                    language="python",
                    resource_dir="",
                )
            return self._kernel_spec

    return CurrentPythonKernelManager


def kernel_env() -> dict[str, str]:
    """The kernel's environment: ours, with the repository root first on PYTHONPATH.

    So ``import helpers`` works in the kernel whether or not the course is pip-installed.
    """
    env = dict(os.environ)
    parts = [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def execute_notebook(nb: Any, cwd: Path, timeout: int = 600) -> NotebookRun:
    """Run every code cell of ``nb`` (in place) in a fresh kernel; never raises for the notebook's faults.

    Errors are allowed (later cells still run). A cell running longer than ``timeout`` seconds is
    interrupted (KeyboardInterrupt in the kernel) and recorded as ``timeout``; when the kernel does
    not answer after that, the remaining cells are ``not run``. A dying kernel (``os._exit``, out of
    memory) ends the run, and the remaining cells are ``not run``.

    Args:
        nb: nbformat v4 notebook; outputs are replaced by this run's.
        cwd: the kernel's working folder (the notebook's folder).
        timeout: seconds per cell.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    run = NotebookRun()
    replies: dict[int, dict[str, Any]] = {}

    def on_cell_executed(cell: Any, cell_index: int, execute_reply: dict[str, Any] | None) -> None:
        if execute_reply is not None:
            replies[cell_index] = execute_reply.get("content", {})

    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        kernel_manager_class=_kernel_manager_class(),
        allow_errors=True,
        interrupt_on_timeout=True,
        error_on_timeout={
            "ename": TIMEOUT_ENAME,
            "evalue": f"timeout after {timeout} s",
            "traceback": [],
        },
        record_timing=False,
        resources={"metadata": {"path": str(cwd)}},
        on_cell_executed=on_cell_executed,
    )
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    for i in code_cells:
        run.cells[i] = CellRun(i, "not run")
    try:
        with client.setup_kernel(env=kernel_env()):
            for i in code_cells:
                try:
                    client.execute_cell(nb.cells[i], i)
                except DeadKernelError:
                    run.kernel_died_in = i
                    break
                except CellTimeoutError:  # not expected with interrupt_on_timeout; be safe
                    run.cells[i] = CellRun(i, "timeout")
                    run.stuck_after_timeout_in = i
                    break
                reply = replies.get(i, {})
                if reply.get("status") == "error" and reply.get("ename") == TIMEOUT_ENAME:
                    run.cells[i] = CellRun(i, "timeout")
                    if not _kernel_answers(client, min(timeout, 30)):
                        run.stuck_after_timeout_in = i
                        break
                elif reply.get("status") == "error":
                    run.cells[i] = CellRun(
                        i, "error", str(reply.get("ename", "")), str(reply.get("evalue", ""))
                    )
                else:
                    run.cells[i] = CellRun(i, "ok")
    except DeadKernelError:
        run.kernel_died_in = run.kernel_died_in if run.kernel_died_in is not None else -1
    except Exception as exc:  # kernel could not start, or the client broke: report, never crash
        if not any(c.status != "not run" for c in run.cells.values()):
            run.startup_error = f"{type(exc).__name__}: {_first_line(str(exc))}"
        elif run.kernel_died_in is None:
            run.kernel_died_in = -1
    return run


def _kernel_answers(client: Any, timeout: int) -> bool:
    """After an interrupted timeout: does the kernel run a trivial cell within ``timeout`` s?"""
    import nbformat

    probe = nbformat.v4.new_code_cell("pass")
    saved = client.timeout
    client.timeout = timeout
    try:
        reply: dict[str, Any] = {}
        hook = client.on_cell_executed
        client.on_cell_executed = lambda cell, cell_index, execute_reply: reply.update(
            (execute_reply or {}).get("content", {})
        )
        try:
            client.execute_cell(probe, -1, store_history=False)
        finally:
            client.on_cell_executed = hook
        return reply.get("status") == "ok"
    except Exception:
        return False
    finally:
        client.timeout = saved


def _first_line(text: str, limit: int = 200) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass
class Reference:
    """One solution notebook: its graded cells, their points and their check code."""

    path: Path
    points: dict[str, float]  # grade_id -> points, in notebook order
    sources: dict[str, str]  # grade_id -> the check cell's code (hidden tests included)


def load_references(folder: Path) -> dict[str, Reference]:
    """``{file name: Reference}`` for every notebook in ``folder`` with at least one check cell.

    Raises:
        FileNotFoundError: when ``folder`` holds no such notebook.
    """
    import nbformat

    refs = {}
    for path in _notebooks_in(folder):
        nb = nbformat.read(path, as_version=4)
        cells = check_cells(nb)
        if cells:
            refs[path.name] = Reference(
                path,
                {gid: pts for gid, (_, pts) in cells.items()},
                {gid: nb.cells[i].source for gid, (i, _) in cells.items()},
            )
    if not refs:
        raise FileNotFoundError(
            f"No notebook in {folder} has graded cells (nbgrader metadata with grade: true). "
            "Pass the folder of the solution notebooks with --reference."
        )
    return refs


COLUMNS = ["student", "notebook", "grade_id", "points", "max_points", "status", "reason"]


def _row(
    student: str, notebook: str, gid: str, pts: float, max_pts: float, status: str, reason: str
) -> dict[str, Any]:
    return dict(
        zip(
            COLUMNS,
            [student, notebook, gid, _fmt(pts), _fmt(max_pts), status, reason],
            strict=False,
        )
    )


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def grade_notebook(path: Path, ref: Reference, student: str, timeout: int) -> list[dict[str, Any]]:
    """Execute one submission and return one CSV row per graded cell of its reference.

    The check cells' code is restored from the reference before running (as ``nbgrader autograde``
    does), so an edited check cannot pass; points always come from the reference.
    """
    import nbformat

    name = ref.path.name
    rows = lambda status, reason: [  # noqa: E731 - every graded cell gets the same verdict
        _row(student, name, gid, 0, pts, status, reason) for gid, pts in ref.points.items()
    ]
    try:
        nb = nbformat.read(path, as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("no list of cells")
    except Exception as exc:
        return rows("error", f"notebook unreadable: {type(exc).__name__}: {_first_line(str(exc))}")

    where: dict[str, int] = {}  # grade_id -> index of the student's (last) check cell
    for index, cell in enumerate(nb.cells):
        gid = nbgrader_metadata(cell).get("grade_id")
        if gid in ref.points and is_check_cell(cell):
            cell.source = ref.sources[gid]
            where[gid] = index
    run = execute_notebook(nb, cwd=path.parent, timeout=timeout)

    out = []
    for gid, pts in ref.points.items():
        index = where.get(gid)
        if run.startup_error:
            status, reason = "error", f"kernel failed to start: {run.startup_error}"
        elif index is None:
            status, reason = "missing", "check cell missing (deleted or metadata lost)"
        else:
            status, reason = _verdict(run, index, timeout, frozenset(where.values()))
        out.append(_row(student, name, gid, pts if status == "passed" else 0, pts, status, reason))
    return out


def _broke(cell: CellRun) -> bool:
    """A cell that failed for a reason other than an exercise's expected failure."""
    expected = ("AssertionError", "NotImplementedError")
    return cell.status == "timeout" or (cell.status == "error" and cell.ename not in expected)


def _verdict(
    run: NotebookRun, index: int, timeout: int, check_indices: frozenset[int] = frozenset()
) -> tuple[str, str]:
    """(status, reason) of the check cell at ``index``; ``check_indices`` are never blamed as the cause."""
    cell = run.cells.get(index, CellRun(index, "not run"))
    k = index + 1  # cells are counted from 1, markdown included, as a reader counts them
    if cell.status == "ok":
        return "passed", "passed"
    if cell.status == "timeout":
        return "failed", f"timeout after {timeout} s in cell {k}"
    if cell.status == "error":
        if cell.ename == "NotImplementedError":
            return "failed", "NotImplementedError: not attempted"
        reason = f"{cell.ename}: {_first_line(cell.evalue)}" if cell.evalue else cell.ename
        if cell.ename != "AssertionError":  # e.g. a NameError: say which earlier cell broke first
            earlier = [
                c
                for i, c in sorted(run.cells.items())
                if i < index and i not in check_indices and _broke(c)
            ]
            if earlier:
                first = earlier[-1]
                what = "timed out" if first.status == "timeout" else f"raised {first.ename}"
                reason += f" (cell {first.index + 1} {what} before)"
        return "failed", reason
    if run.kernel_died_in is not None:
        at = f" in cell {run.kernel_died_in + 1}" if run.kernel_died_in >= 0 else ""
        return "failed", f"kernel died{at}"
    if run.stuck_after_timeout_in is not None:
        return (
            "failed",
            f"timeout after {timeout} s in cell {run.stuck_after_timeout_in + 1} (kernel did not recover)",
        )
    return "error", "cell not run"


def _match_reference(path: Path, refs: dict[str, Reference]) -> Reference | None:
    """The reference with the same file name, else the one sharing most grade ids (renamed files)."""
    if path.name in refs:
        return refs[path.name]
    try:
        import nbformat

        ids = set(check_cells(nbformat.read(path, as_version=4)))
    except Exception:
        return None
    best = max(refs.values(), key=lambda r: len(ids & set(r.points)))
    return best if ids & set(best.points) else None


def _submitted_notebooks(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*.ipynb")
        if ".ipynb_checkpoints" not in p.parts and not p.name.startswith(".")
    )


def grade(submissions: Path, reference: Path, timeout: int = 600) -> list[dict[str, Any]]:
    """Grade every student folder in ``submissions``; return the CSV rows (see ``COLUMNS``).

    Layout: ``submissions/<student id>/<notebook>.ipynb`` (sub-folders below the student's are
    searched too, so nbgrader's ``submitted/<student>/<assignment>/`` works). A notebook is graded
    against the reference notebook of the same file name, or, when renamed, the one sharing most
    grade ids. A notebook that some students submitted and others did not gives the others
    ``missing`` rows. Nothing a submission does stops the grading of the others.

    Raises:
        FileNotFoundError: when ``submissions`` has no student folder, or ``reference`` no graded notebook.
    """
    refs = load_references(reference)
    if not submissions.is_dir():
        raise FileNotFoundError(f"{submissions} is not a folder of student folders.")
    for stray in sorted(submissions.glob("*.ipynb")):
        print(
            f"ignored {stray}: put each student's notebooks in {submissions}/<student id>/",
            file=sys.stderr,
        )
    students = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not students:
        raise FileNotFoundError(
            f"{submissions} has no student folders ({submissions}/<student id>/<notebook>.ipynb)."
        )

    chosen: dict[str, dict[str, Path]] = {}  # student -> reference name -> submitted file
    rows: list[dict[str, Any]] = []
    for folder in students:
        chosen[folder.name] = {}
        notebooks = _submitted_notebooks(folder)
        for path in notebooks:
            ref = _match_reference(path, refs)
            if ref is None:
                print(
                    f"ignored {path}: matches no reference notebook in {reference}", file=sys.stderr
                )
                continue
            current = chosen[folder.name].get(ref.path.name)
            if current is None or _prefer(path, current, ref):
                if current is not None:
                    print(
                        f"ignored {current}: {path} is graded as {ref.path.name} instead",
                        file=sys.stderr,
                    )
                chosen[folder.name][ref.path.name] = path
            else:
                print(
                    f"ignored {path}: {current} is graded as {ref.path.name} instead",
                    file=sys.stderr,
                )
        if not notebooks:
            rows.append(_row(folder.name, "", "", 0, 0, "missing", "no notebook submitted"))
    assignment = sorted({name for per_student in chosen.values() for name in per_student})

    for folder in students:
        for name in assignment:
            ref = refs[name]
            path = chosen[folder.name].get(name)
            if path is None:
                rows.extend(
                    _row(folder.name, name, g, 0, p, "missing", "notebook not submitted")
                    for g, p in ref.points.items()
                )
                continue
            print(f"grading {path} against {ref.path} ...", file=sys.stderr, flush=True)
            rows.extend(grade_notebook(path, ref, folder.name, timeout))
    return rows


def _prefer(new: Path, old: Path, ref: Reference) -> bool:
    """Of two files graded as the same notebook: the exact name wins, then the newer file."""
    if (new.name == ref.path.name) != (old.name == ref.path.name):
        return new.name == ref.path.name
    return new.stat().st_mtime > old.stat().st_mtime


def write_csv(rows: Iterable[dict[str, Any]], path: Path) -> None:
    """Write grading rows with the columns ``COLUMNS``."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def totals_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table: per student, points / max points and checks passed."""
    per: dict[str, list[float]] = {}
    for r in rows:
        t = per.setdefault(r["student"], [0.0, 0.0, 0, 0])
        t[0] += float(r["points"])
        t[1] += float(r["max_points"])
        t[2] += r["status"] == "passed"
        t[3] += bool(r["grade_id"])
    width = max([len("student")] + [len(s) for s in per])
    lines = [f"{'student':<{width}}  {'points':>12}  {'checks passed':>13}"]
    for student, (pts, max_pts, passed, checks) in per.items():
        lines.append(
            f"{student:<{width}}  {_fmt(pts) + ' / ' + _fmt(max_pts):>12}  {f'{passed} / {checks}':>13}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``make-student`` and ``grade`` (see docs/grading.md)."""
    parser = argparse.ArgumentParser(
        prog="python -m helpers.grading", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ms = sub.add_parser("make-student", help="write student versions of the exercise notebooks")
    ms.add_argument(
        "notebooks",
        nargs="?",
        default="notebooks",
        help="folder of solution notebooks, or one notebook (default: notebooks)",
    )
    ms.add_argument(
        "--out", default="student", help="folder for the student versions (default: student)"
    )
    gr = sub.add_parser("grade", help="execute and grade submissions/<student>/<notebook>.ipynb")
    gr.add_argument("submissions", help="folder with one sub-folder per student id")
    gr.add_argument("--out", default="grades.csv", help="CSV to write (default: grades.csv)")
    gr.add_argument("--timeout", type=int, default=600, help="seconds per cell (default: 600)")
    gr.add_argument(
        "--reference", default="notebooks", help="folder of solution notebooks (default: notebooks)"
    )
    args = parser.parse_args(argv)

    try:
        if args.command == "make-student":
            written = make_student(Path(args.notebooks), Path(args.out))
            print(f"{len(written)} student notebook(s) in {args.out}/")
        else:
            rows = grade(Path(args.submissions), Path(args.reference), timeout=args.timeout)
            write_csv(rows, Path(args.out))
            print(totals_table(rows))
            print(f"wrote {args.out} ({len(rows)} rows)")
    except (FileNotFoundError, ValueError) as exc:  # SolutionMarkerError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
