"""Running a kernel check script in a subprocess: in Triton's CPU interpreter (``device="cpu"``,
``TRITON_INTERPRET=1``, which Triton reads at import) or on a GPU. Shared by the kernel tests."""

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="Triton is not installed"
)


def run_script(code: str, name: str, device: str, broken: str = "none"):
    """Run ``code`` as ``<name>.py`` with argv ``device broken`` from the repository root.

    From a file: Triton compiles @jit functions for a GPU from their source file (``-c`` has
    none). Returns the ``subprocess.CompletedProcess`` (stdout and stderr captured as text)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"} if device == "cpu" else None
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / f"{name}.py"
        script.write_text(code)
        return subprocess.run(
            [sys.executable, str(script), device, broken],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )


def assert_caught(r, broken: str = "none") -> None:
    """A check script's result (:func:`run_script`): it printed OK when nothing was broken, and
    failed on an AssertionError when ``broken`` named a broken variant (the check can fail)."""
    if broken == "none":
        assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
    else:
        assert r.returncode != 0 and "AssertionError" in r.stderr, (broken, r.stderr[-3000:])
