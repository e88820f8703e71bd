"""Running a notebook in a fresh kernel for the grader: every code cell, errors allowed, a timeout
per cell, and a record of what happened to each cell that never raises for the notebook's faults.

The kernel is always this Python interpreter with the repository on its ``PYTHONPATH``, optionally
started under a command (the OS sandbox of :mod:`helpers.grading.sandbox`).
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helpers
from helpers.grading import remote

TIMEOUT_ENAME = "CellTimeoutError"
# The folder, in a kernel's private folder, of the checker's socket (helpers.grading.remote): the
# grader makes it read-only in the sandbox, so a submission cannot replace the socket.
CHECKER_FOLDER = "checker"
REPO_ROOT = helpers.REPO_ROOT


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
    over_budget_at: int | None = None  # the first cell not run: the notebook's time was up


def _kernel_manager_class(
    prefix: tuple[str, ...] = (), connection_file: Path | None = None
) -> type:
    """An AsyncKernelManager that always launches ipykernel with *this* Python interpreter, after
    ``prefix`` (the sandbox's command, :func:`helpers.grading.sandbox.sandbox_prefix`) when one is
    given.

    A ``python3`` kernelspec installed elsewhere (another conda env, ~/.local) would otherwise run
    the submissions with a different torch, or without ``helpers``.
    """
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager

    argv = [*prefix, sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]

    class CurrentPythonKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            if connection_file is not None:  # where the sandboxed kernel can read it
                self.connection_file = str(connection_file)

        @property
        def kernel_spec(self) -> KernelSpec:  # type: ignore[override]
            if self._kernel_spec is None:
                self._kernel_spec = KernelSpec(
                    argv=argv,
                    display_name=(
                        f"Python {sys.version_info.major}.{sys.version_info.minor} (grader)"
                    ),
                    language="python",
                    resource_dir="",
                )
            return self._kernel_spec

    return CurrentPythonKernelManager


def kernel_env(private: Path | None = None) -> dict[str, str]:
    """The kernel's environment: ours, with the repository root first on PYTHONPATH (so
    ``import helpers`` works in the kernel whether or not the course is pip-installed).

    With ``private`` (a folder of this kernel's own), its home and temporary folder are
    ``private/home`` and ``private/tmp`` (made here): ``HOME``, ``TMPDIR``, ``IPYTHONDIR``, the
    XDG folders and matplotlib's, no user site-packages. So nothing in the teacher's home (IPython
    startup files, ``.pth`` files in ``~/.local``) runs in it, and what one kernel leaves there
    is gone for the next. The Hugging Face cache stays the teacher's (``HF_HOME``).
    """
    env = dict(os.environ)
    parts = [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    if private is not None:
        home, tmp = private / "home", private / "tmp"
        for folder in (home, tmp):
            folder.mkdir(exist_ok=True)
        env.setdefault("HF_HOME", str(hf_home()))
        env.update(
            HOME=str(home),
            TMPDIR=str(tmp),
            IPYTHONDIR=str(home / ".ipython"),
            XDG_CONFIG_HOME=str(home / ".config"),
            XDG_CACHE_HOME=str(home / ".cache"),
            XDG_DATA_HOME=str(home / ".local" / "share"),
            MPLCONFIGDIR=str(home / ".config" / "matplotlib"),
            PYTHONNOUSERSITE="1",
        )
        for name in ("PYTHONSTARTUP", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR"):
            env.pop(name, None)
    return env


def hf_home() -> Path:
    """The Hugging Face cache folder of this process: ``$HF_HOME``, else ``~/.cache/huggingface``
    (chapter 13's GPT-2 weights)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "huggingface"
    return Path(os.environ.get("HF_HOME", default))


def execute_notebook(
    nb: Any,
    cwd: Path,
    timeout: int = 600,
    sandbox: tuple[str, ...] = (),
    private: Path | None = None,
    guarded: frozenset[int] = frozenset(),
    checks: dict[int, tuple[str, str]] | None = None,
    budget_s: float | None = None,
    checker: remote.Checker | None = None,
) -> NotebookRun:
    """Run every code cell of ``nb`` (in place) in a fresh kernel;
    never raises for the notebook's faults.

    Errors are allowed (later cells still run). A cell running longer than ``timeout`` seconds is
    interrupted (KeyboardInterrupt in the kernel) and recorded as ``timeout``; when the kernel does
    not answer after that, the remaining cells are ``not run``. A dying kernel (``os._exit``, out of
    memory) ends the run, and the remaining cells are ``not run``.

    Args:
        nb: nbformat v4 notebook; outputs are replaced by this run's.
        cwd: the kernel's working folder (the notebook's folder).
        timeout: seconds per cell.
        sandbox: a command the kernel starts under
            (:func:`helpers.grading.sandbox.sandbox_prefix`); () = none.
        private: a folder of this kernel's own for its home, temporary files and connection
            file (:func:`kernel_env`); None = the grader's.
        guarded: indices of cells (the check cells) before which the kernel's import machinery,
            builtins and IPython's cell machinery are restored as they were at its start
            (:mod:`helpers.grading.guard`); when that fails, the cell is not run and is recorded
            as an error ``GraderGuardError``.
        checks: ``{cell index: (grade_id, function name)}``: cells run as checks in a process of
            their own (:mod:`helpers.grading.remote`): the cell's code becomes
            :func:`~helpers.grading.remote.serve_code`, which serves the learner's function to the
            checker, and the cell's status is the checker's verdict, not the kernel's reply (a
            timeout or a dead kernel still counts as such).
        budget_s: seconds for the whole notebook; once past it, no further cell is run (a
            submission of hundreds of slow cells cannot hold up the others for days).
        checker: the checker process to run ``checks`` in (one a grading run shares: it never runs
            a submission's code, and each check is a request of its own); None: one of this
            notebook's own, stopped at the end.
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
        kernel_manager_class=_kernel_manager_class(
            sandbox, None if private is None else private / "kernel.json"
        ),
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
    checks = checks or {}
    own_checker = checker is None
    checker = remote.Checker() if checker is None else checker
    pending = False  # a check begun whose verdict was not read: its checker must be stopped
    sockets = (private or cwd) / CHECKER_FOLDER  # read-only for a sandboxed kernel (grader)
    sockets.mkdir(exist_ok=True)
    address = str(sockets / "check.sock")
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    for i in code_cells:
        run.cells[i] = CellRun(i, "not run")
    try:
        with client.setup_kernel(env=kernel_env(private)):
            nonce = secrets.token_hex(8)
            guard_problem = _guard(client, "snapshot", nonce) if guarded else None
            started = time.monotonic()
            for i in code_cells:
                if budget_s is not None and time.monotonic() - started > budget_s:
                    run.over_budget_at = i
                    break
                if i in guarded:
                    problem = guard_problem or _guard(client, "restore", nonce)
                    if problem:
                        run.cells[i] = CellRun(i, "error", GUARD_ENAME, problem)
                        continue
                if i in checks:
                    grade_id, function = checks[i]
                    try:
                        token = checker.begin(grade_id, address, function, timeout)
                    except RuntimeError as exc:
                        run.cells[i] = CellRun(i, "error", "GraderError", str(exc))
                        continue
                    nb.cells[i].source = remote.serve_code(address, token, function)
                    pending = True
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
                    if i in checks:
                        checker.close()  # its verdict is moot; the next check starts a new one
                        pending = False
                    if not _kernel_answers(client, min(timeout, 30)):
                        run.stuck_after_timeout_in = i
                        break
                elif i in checks:  # the checker's verdict; the kernel's reply says nothing
                    verdict = checker.finish(address, timeout)
                    pending = False
                    status = "ok" if verdict["status"] == "ok" else "error"
                    run.cells[i] = CellRun(i, status, verdict["ename"], verdict["evalue"])
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
            run.startup_error = f"{type(exc).__name__}: {first_line(str(exc))}"
        elif run.kernel_died_in is None:
            run.kernel_died_in = -1
    finally:
        if own_checker or pending:
            checker.close()
    return run


GUARD_ENAME = "GraderGuardError"


def _guard(client: Any, what: str, nonce: str, timeout: int = 60) -> str | None:
    """Call :mod:`helpers.grading.guard`'s ``what`` ("snapshot" or "restore") in the kernel through
    an ``execute_request``'s ``user_expressions`` (evaluated by ``eval``, never seen by input
    transformers); None when it answered ``"<what>d <nonce>"``, else why not."""
    expr = f"__import__('helpers.grading.guard', fromlist=['guard']).{what}({nonce!r})"
    saved = client.timeout
    client.timeout = timeout
    try:
        msg_id = client.kc.execute(
            "", silent=True, store_history=False, user_expressions={"guard": expr}
        )
        reply = client.wait_for_reply(msg_id) or {}
    except Exception as exc:  # a dead or stuck kernel: the cell is not run
        return f"the grader's {what} did not answer ({type(exc).__name__})"
    finally:
        client.timeout = saved
    answer = reply.get("content", {}).get("user_expressions", {}).get("guard", {})
    text = answer.get("data", {}).get("text/plain", "")
    expected = repr(f"{ {'snapshot': 'snapshot', 'restore': 'restored'}[what] } {nonce}")
    if text != expected:
        return (
            f"the grader could not {what} the kernel's state before this check "
            "(the submission changed how the kernel runs code)"
        )
    return None


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


def first_line(text: str, limit: int = 200) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def remove_tree(folder: Path) -> None:
    """Remove a kernel's folder whatever a submission left in it; never raises. ``rm -rf`` first
    (a tree thousands of folders deep makes ``shutil.rmtree`` recurse past Python's limit), then
    ``shutil.rmtree`` for what is left (no ``rm`` on the machine)."""
    import shutil
    import subprocess

    try:
        subprocess.run(["rm", "-rf", "--", str(folder)], capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        shutil.rmtree(folder, ignore_errors=True)
    except Exception:  # RecursionError
        pass
