"""Checks that run outside the submission's kernel: the learner's function is called over a
socket.

When grading, a check never runs in the interpreter that ran the submission. The grader starts a
*checker* process of its own (:class:`Checker`, running :func:`checker_main`) that
imports the checks from the read-only course and calls ``CHECKS[grade_id](fn)`` with ``fn`` a
:class:`RemoteFunction`; the submission's kernel runs :func:`serve`, which calls the learner's
function on the arguments the checker sends and sends back what it returned. So the verdict,
``PASS`` or the ``AssertionError``, is computed where no code of the submission ever ran, and a
submission can pass a check only by answering the checker's calls as a correct answer would.

The two directions are not alike:

- checker -> kernel: :mod:`pickle` (the arguments, tensors included, and the answers of callbacks).
  The kernel trusts the grader.
- kernel -> checker: :func:`helpers.grading.wire.encode`'s JSON, which can only hold data (None,
  bool, int, float, str, lists, tuples, dicts, tensors, dtypes), is limited in size, and is
  decoded by :func:`helpers.grading.wire.decode` without running anything. The checker never
  unpickles what the kernel sends.

Arguments that are callables (``try_step``, ``synchronize``, ``parts_for_batch``) stay in the
checker: the kernel gets a stub that calls back over the same socket. A check that needs the
learner's code to run against objects it cannot send (a model it trains, a compiled function,
hooks) passes a *harness*, a function of this package that runs in the kernel beside the learner's
function and returns data (:func:`helpers.grading.common.run_learner`); what the harness reports is
the submission's own account, and the check judges it with references it computes itself.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import pickle
import shutil
import socket
import sys
import traceback
from collections.abc import Callable
from typing import Any

from helpers.grading import wire

# ----------------------------------------------------------------------------------------------
# Exceptions across the boundary
# ----------------------------------------------------------------------------------------------


def _exception_name(exc: BaseException) -> str:
    kind = type(exc)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


_LEARNER_ERRORS: dict[str, type] = {}


def rebuild_exception(name: str, message: str) -> Exception:
    """An exception of the same class for a built-in or torch exception the learner's code raised
    (``NotImplementedError``, ``torch.OutOfMemoryError``); else of a new class with that name (its
    ``__name__`` is the learner's class's)."""
    import torch

    known = getattr(builtins, name, None)
    if isinstance(known, type) and issubclass(known, Exception):
        return known(message)
    if name in ("torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError"):
        return torch.OutOfMemoryError(message)
    short = name.rsplit(".", 1)[-1] or "Exception"
    if not short.isidentifier():
        short = "LearnerError"
    kind = _LEARNER_ERRORS.setdefault(short, type(short, (Exception,), {"__module__": "learner"}))
    return kind(message)


# ----------------------------------------------------------------------------------------------
# The checker's side
# ----------------------------------------------------------------------------------------------


class CallbackRef:
    """Stands for a checker-side callable in the arguments sent to the kernel."""

    def __init__(self, index: int):
        self.index = index


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The harness of a plain call: ``fn(*args, **kwargs)``."""
    return fn(*args, **kwargs)


class RemoteFunction:
    """The learner's function, which lives in the submission's kernel; calling it sends the
    arguments there and returns what the function returned there (decoded: tensors on the CPU, no
    objects). An exception it raised is raised here with the same class name and message.

    Args:
        sock: the connection to the kernel's :func:`serve`.
        name: the function's name in the submission (for messages).
        timeout: seconds to wait for any one answer of the kernel (TimeoutError after).
    """

    def __init__(self, sock: socket.socket, name: str, timeout: float):
        self.sock, self.__name__, self.timeout = sock, name, timeout
        sock.settimeout(timeout)

    def __repr__(self) -> str:
        return f"<the learner's {self.__name__}, in the submission's kernel>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(call, *args, **kwargs)

    def run(self, harness: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``harness(learner's function, *args, **kwargs)`` run in the kernel; its result, decoded.

        ``harness`` must be a module-level function of ``helpers.grading``; callables among
        ``args`` (at the top level, or in a list, tuple or dict there) are called back here.
        """
        callbacks: list[Callable[..., Any]] = []

        def ref(value: Any) -> Any:
            if callable(value) and not isinstance(value, type) and not _is_data(value):
                callbacks.append(value)
                return CallbackRef(len(callbacks) - 1)
            if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
                return type(value)(ref(v) for v in value)
            if isinstance(value, dict):
                return {k: ref(v) for k, v in value.items()}
            return value

        name = f"{harness.__module__}:{harness.__qualname__}"
        if not name.startswith("helpers.grading."):
            raise ValueError(f"{name} is not a harness of helpers.grading")
        message = ("run", name, ref(args), ref(kwargs))
        wire.send(self.sock, pickle.dumps(message))
        while True:
            reply = wire.decode(wire.recv(self.sock))
            if not (isinstance(reply, list) and reply and isinstance(reply[0], str)):
                raise wire.ProtocolError("the kernel sent a malformed reply")
            kind = reply[0]
            if kind == "result" and len(reply) == 2:
                return reply[1]
            if kind == "raise" and len(reply) == 3 and all(isinstance(r, str) for r in reply):
                raise rebuild_exception(reply[1], reply[2])
            if kind == "call" and len(reply) == 4 and isinstance(reply[1], int):
                index, cargs, ckwargs = reply[1], reply[2], reply[3]
                if not (0 <= index < len(callbacks) and isinstance(cargs, list)):
                    raise wire.ProtocolError("the kernel called back a function it was not given")
                if not (isinstance(ckwargs, dict) and all(isinstance(k, str) for k in ckwargs)):
                    raise wire.ProtocolError("malformed keyword arguments")
                try:
                    answer = ("return", callbacks[index](*cargs, **ckwargs))
                except Exception as exc:
                    answer = ("raise", exc)
                try:
                    body = pickle.dumps(answer)
                except Exception:  # an exception that does not pickle: its class name and text
                    body = pickle.dumps(
                        ("raise", RuntimeError(f"{_exception_name(answer[1])}: {answer[1]}"))
                    )
                wire.send(self.sock, body)
                continue
            raise wire.ProtocolError(f"the kernel sent an unexpected reply {kind!r}")

    def stop(self) -> None:
        """Tell the kernel's :func:`serve` to return."""
        with contextlib.suppress(OSError):
            wire.send(self.sock, pickle.dumps(("stop",)))


def _is_data(value: Any) -> bool:
    import torch

    return isinstance(value, (torch.Tensor, torch.nn.Module, torch.dtype))


# ----------------------------------------------------------------------------------------------
# The kernel's side
# ----------------------------------------------------------------------------------------------


class _Callback:
    """In the kernel: a checker-side callable, called over the socket."""

    def __init__(self, sock: socket.socket, index: int):
        self._sock, self._index = sock, index

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        wire.send(self._sock, wire.encode(["call", self._index, list(args), kwargs]))
        kind, value = pickle.loads(wire.recv(self._sock))
        if kind == "raise":
            raise value
        return value


def _resolve(name: str) -> Callable[..., Any]:
    import importlib

    module, _, qualname = name.partition(":")
    if not module.startswith("helpers.grading.") or "." in qualname or not qualname:
        raise ValueError(f"{name} is not a harness of helpers.grading")
    return getattr(importlib.import_module(module), qualname)


def serve(address: str, token: str, learner: Callable[[], Any]) -> None:
    """In the submission's kernel: connect to the checker at ``address`` (a Unix socket), then run
    what it asks (``harness(learner(), *args)``) and send back each result or exception, until it
    says stop. ``learner`` returns the learner's function (a NameError there is sent as the
    answer). Called by the grader in place of a check cell; returns None."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    try:
        wire.send(sock, wire.encode(["hello", token]))
        while True:
            message = pickle.loads(wire.recv(sock))
            if message[0] != "run":
                return
            _, name, args, kwargs = message

            def stubs(value: Any) -> Any:
                if isinstance(value, CallbackRef):
                    return _Callback(sock, value.index)
                if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
                    return type(value)(stubs(v) for v in value)
                if isinstance(value, dict):
                    return {k: stubs(v) for k, v in value.items()}
                return value

            try:
                value = _resolve(name)(learner(), *stubs(args), **stubs(kwargs))
                try:
                    body = wire.encode(["result", value])
                except (TypeError, ValueError) as exc:
                    body = wire.encode(["raise", "TypeError", f"returned {_what(value)}: {exc}"])
            except wire.ProtocolError:
                raise
            except Exception as exc:
                body = wire.encode(["raise", _exception_name(exc), str(exc)[:4000]])
            wire.send(sock, body)
    finally:
        sock.close()


def _what(value: Any) -> str:
    return f"a {type(value).__name__}"


# ----------------------------------------------------------------------------------------------
# The checker process
# ----------------------------------------------------------------------------------------------


def serve_code(address: str, token: str, function: str) -> str:
    """The code the grader runs in the kernel in place of a check cell."""
    return (
        "__import__('helpers.grading.remote', fromlist=['serve']).serve("
        f"{address!r}, {token!r}, lambda: {function})"
    )


def run_check(
    grade_id: str,
    listener: socket.socket,
    token: str,
    function: str,
    timeout: float,
    on_accept: Callable[[], None] = lambda: None,
) -> dict[str, str]:
    """Accept the kernel's connection on ``listener`` and run ``grading.CHECKS[grade_id]`` on
    the learner's function there; ``on_accept`` is called once a connection came.

    Returns ``{"status": "ok" | "error", "ename", "evalue", "output"}``: what the check printed,
    or the exception it raised (a NotImplementedError the learner's function raised included);
    ``GraderError`` when the kernel did not connect, did not say hello with ``token``, broke the
    protocol or did not answer within ``timeout`` seconds."""
    from helpers import grading

    out = io.StringIO()
    not_run = "the submission's kernel did not run the check"
    listener.settimeout(timeout)
    try:
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            return _verdict("error", "GraderError", not_run, out)
        on_accept()
        with sock:
            sock.settimeout(timeout)
            try:
                hello = wire.decode(wire.recv(sock))
            except wire.ProtocolError:
                return _verdict("error", "GraderError", not_run, out)
            if hello != ["hello", token]:
                return _verdict("error", "GraderError", "the kernel did not say hello", out)
            fn = RemoteFunction(sock, function, timeout)
            try:
                with contextlib.redirect_stdout(out):
                    grading.CHECKS[grade_id](fn)
            finally:
                fn.stop()
        return _verdict("ok", "", "", out)
    except (wire.ProtocolError, OSError) as exc:
        why = (
            "the kernel's answer did not come in time"
            if isinstance(exc, TimeoutError)
            else f"the kernel's connection broke ({type(exc).__name__}: {exc})"
        )
        return _verdict("error", "GraderError", why, out)
    except Exception as exc:
        return _verdict("error", type(exc).__name__, str(exc), out)


def _verdict(status: str, ename: str, evalue: str, out: io.StringIO) -> dict[str, str]:
    return {"status": status, "ename": ename, "evalue": evalue, "output": out.getvalue()[:65536]}


def checker_main(argv: list[str] | None = None) -> int:
    """``python -m helpers.grading.remote``: the grader's checker process. Reads one JSON request
    per line on stdin, ``{"grade_id", "socket", "token", "function", "timeout"}``; for each,
    listens on the Unix socket ``socket``, answers ``{"listening": true}``, then
    ``{"accepted": true}`` when a connection comes, then the verdict (:func:`run_check`), one JSON
    line each on stdout."""
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # nothing a check prints outside its capture can break the protocol
    for line in sys.stdin:
        request = json.loads(line)
        path = request["socket"]
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(OSError):  # left by a checker stopped mid-check
            os.unlink(path)
        try:
            listener.bind(path)
            listener.listen(1)
            proto.write(json.dumps({"listening": True}) + "\n")
            try:
                verdict = run_check(
                    request["grade_id"],
                    listener,
                    request["token"],
                    request["function"],
                    float(request["timeout"]),
                    on_accept=lambda: proto.write(json.dumps({"accepted": True}) + "\n"),
                )
            except Exception:  # a fault of the checker itself: say so, keep serving
                last = traceback.format_exc(limit=1).strip().splitlines()[-1]
                verdict = {"status": "error", "ename": "GraderError", "evalue": last, "output": ""}
        finally:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
        proto.write(json.dumps(verdict) + "\n")
    return 0


# sys.path loses the working folder ('' for -c) before anything is imported: a json.py or
# helpers/ planted there would otherwise be imported in place of the real ones.
_CHECKER_MAIN = (
    "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "from helpers.grading import remote; sys.exit(remote.checker_main())"
)


class Checker:
    """The grader's side of the checker process (:func:`checker_main`): started on the first
    check, a fresh interpreter of this Python that imports the checks from the course on disk and
    never runs a line of any submission. One per submission notebook.

    Use: ``token = checker.begin(grade_id, socket_path, function, timeout)``, run
    :func:`serve_code` with that token in the kernel, then ``checker.finish(socket_path)``.
    """

    def __init__(self) -> None:
        self.proc: Any = None
        self._buffer = b""
        self._accepted = False
        self._folder = ""

    def _start(self) -> None:
        import subprocess
        import tempfile

        import helpers

        env = dict(os.environ)
        paths = [
            str(helpers.REPO_ROOT),
            *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p),
        ]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        self._folder = tempfile.mkdtemp(prefix="checker-")  # mode 0700: nobody else writes there
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHECKER_MAIN],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self._folder,
            env=env,
        )
        self._buffer = b""

    def _line(self, seconds: float) -> dict | None:
        """The checker's next JSON line, or None after ``seconds`` or when it ended."""
        import selectors
        import time

        deadline = time.monotonic() + seconds
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    return None
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def begin(self, grade_id: str, address: str, function: str, timeout: float) -> str:
        """Have the checker listen on ``address`` for the check ``grade_id`` of the learner's
        ``function`` (a name in the kernel); returns the token the kernel must say hello with.

        Raises:
            RuntimeError: the checker process did not start or did not answer within 120 s.
        """
        import secrets

        if self.proc is None or self.proc.poll() is not None:
            self._start()
        token = secrets.token_hex(16)
        request = dict(
            grade_id=grade_id, socket=address, token=token, function=function, timeout=timeout
        )
        self._accepted = False
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            pass
        if self._line(120) != {"listening": True}:
            self.close()
            raise RuntimeError("the grader's checker process did not start")
        return token

    def finish(self, address: str, timeout: float) -> dict[str, str]:
        """The verdict of the check begun last, once the kernel's cell has ended: when the kernel
        never connected, the grader connects to end the wait; a checker that gives no verdict
        within ``timeout`` seconds is stopped (the next :meth:`begin` starts a new one)."""
        answer = self._line(0.5)
        if answer == {"accepted": True}:
            self._accepted = True
            answer = None
        why = "the check did not finish"
        if answer is None and not self._accepted:
            # The cell ended without connecting: end the checker's wait by connecting ourselves,
            # never blocking (the kernel may have put a listener of its own at that path), and
            # give it a few seconds to answer before it is stopped.
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as poke:
                poke.settimeout(2)
                poke.connect(address)
            timeout, why = min(timeout, 10), "the submission's kernel did not run the check"
        while answer is None or answer == {"accepted": True}:
            answer = self._line(timeout)
            if answer is None:
                self.close()
                return {"status": "error", "ename": "GraderError", "evalue": why, "output": ""}
        if not (isinstance(answer, dict) and answer.get("status") in ("ok", "error")):
            self.close()
            return {
                "status": "error",
                "ename": "GraderError",
                "evalue": "the checker's answer was malformed",
                "output": "",
            }
        return answer

    def close(self) -> None:
        """Stop the checker process (a later :meth:`begin` starts a new one)."""
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            with contextlib.suppress(Exception):
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None
        if self._folder:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = ""


def check_over_socket(grade_id: str, fn: Callable[..., Any], timeout: float = 300.0) -> dict:
    """Run ``grading.CHECKS[grade_id]`` on ``fn`` the way the grader does, through a
    :class:`RemoteFunction` and this module's protocol, with ``fn`` served by a thread of this
    process (tests: every check must pass a right answer and reject the wrong ones this way too).
    Returns :func:`run_check`'s verdict."""
    import secrets
    import tempfile
    import threading

    with tempfile.TemporaryDirectory(prefix="check-") as folder:
        address = os.path.join(folder, "socket")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(1)
        token = secrets.token_hex(8)
        kernel = threading.Thread(target=_serve_quietly, args=(address, token, fn), daemon=True)
        kernel.start()
        try:
            return run_check(grade_id, listener, token, getattr(fn, "__name__", "fn"), timeout)
        finally:
            listener.close()
            kernel.join(timeout=10)


def _serve_quietly(address: str, token: str, fn: Callable[..., Any]) -> None:
    with contextlib.suppress(wire.ProtocolError, OSError):
        serve(address, token, lambda: fn)


if __name__ == "__main__":
    # The package's copy of this module, whose RemoteFunction the checks test for, not __main__.
    from helpers.grading import remote as _remote

    raise SystemExit(_remote.checker_main())
