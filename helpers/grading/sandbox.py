"""The grader's OS sandbox: a private mount namespace (``unshare``) in which some paths are
read-only and others look empty. The grader starts each submission's kernel in it with the
repository and the Python environment read-only and the solutions, the right answers and the
submissions hidden (:func:`helpers.grading.grader.grade`). Linux only: :func:`sandbox_available`
says whether this machine allows it, and why not.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from helpers.grading.kernel import first_line

# Run inside a new mount namespace (unshare): bind each path before "--hide" read-only, cover each
# path after it with an empty tmpfs, then exec the kernel. Nothing outside the namespace changes.
_SANDBOX_SCRIPT = """mode=ro
for a in "$@"; do
  shift
  case "$a" in
    --hide) mode=hide ;;
    --) exec "$@" ;;
    *) if [ "$mode" = ro ]; then mount --bind "$a" "$a" && mount -o remount,bind,ro "$a" || exit 97
       else mount -t tmpfs -o size=1m grader-hidden "$a" || exit 97; fi ;;
  esac
done
exit 98"""


def sandbox_prefix(read_only: Iterable[Path], hidden: Iterable[Path]) -> tuple[str, ...]:
    """The command that starts a kernel in an OS sandbox: a private mount namespace (``unshare``,
    util-linux; as an unprivileged user also a user namespace) in which ``read_only`` paths cannot
    be written and ``hidden`` paths look empty. Paths that do not exist are left out."""
    user = () if os.geteuid() == 0 else ("--user", "--map-root-user")
    ro = [str(Path(p).resolve()) for p in read_only if Path(p).exists()]  # absolute: the sandbox
    hide = [str(Path(p).resolve()) for p in hidden if Path(p).is_dir()]  # starts in another folder
    return (
        "unshare",
        "--mount",
        "--propagation",
        "private",
        *user,
        "sh",
        "-c",
        _SANDBOX_SCRIPT,
        "sh",
        *ro,
        "--hide",
        *hide,
        "--",
    )


_sandbox_checked: tuple[bool, str] | None = None


def sandbox_available() -> tuple[bool, str]:
    """Whether :func:`sandbox_prefix` works on this machine (tried once per process), and why not.

    It needs ``unshare`` and the right to make mount namespaces: root, or user namespaces enabled
    for unprivileged users (most Linux distributions). Not on macOS or Windows.
    """
    global _sandbox_checked
    if _sandbox_checked is None:
        import shutil
        import subprocess
        import tempfile

        if shutil.which("unshare") is None:
            _sandbox_checked = (False, "the unshare command (util-linux) is not installed")
        else:
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "secret").write_text("x")
                cmd = [
                    *sandbox_prefix([Path(tmp)], [Path(tmp)]),
                    "sh",
                    "-c",
                    "test ! -e $0/secret",
                    tmp,
                ]
                try:
                    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                    ok = done.returncode == 0
                    why = "" if ok else first_line(done.stderr or f"exit status {done.returncode}")
                except (OSError, subprocess.TimeoutExpired) as exc:
                    ok, why = False, first_line(str(exc))
            _sandbox_checked = (ok, why)
    return _sandbox_checked
