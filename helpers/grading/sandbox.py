"""The grader's OS sandbox: a private mount namespace and PID namespace (``unshare``) in which
some paths are read-only, some look empty, and some are fresh private scratch space.

The grader starts each submission's kernel in it (:func:`helpers.grading.grader.grade`): the
repository and the Python environment read-only; the solutions, the right answers, the
submissions, the teacher's home and the folder of the grades CSV hidden; ``/tmp``, ``/var/tmp``
and ``/dev/shm`` empty and private; only the kernel's own temporary folder writable where it
was. The kernel is PID 1 of a new PID namespace with its own ``/proc``, so the grader's
processes (their ``/proc/<pid>/root``, ``cwd``, ``mem``, ``environ``) are invisible and no
signal can reach them; every process the submission starts dies with the kernel. Before the
kernel starts, every capability is dropped, so a submission cannot undo a mount. Linux only:
:func:`sandbox_available` says whether this machine allows it, and why not.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import helpers
from helpers.grading import kernel
from helpers.grading.kernel import first_line

REPO_ROOT = helpers.REPO_ROOT

# Run by this Python (-I -S: no site, no environment) inside the new namespaces, as their PID 1:
# argv = [mode, path, mode, path, ..., "--", command...] with mode ro (bind read-only), rw (bind as
# is), hide (an empty 1 MiB tmpfs) or scratch (an empty private tmpfs, mode 1777). Every ro/rw path
# is opened first, so it can be bound from its descriptor even once a hidden folder above it is
# covered; mounts are made from the shallowest path down, binds before covers at the same depth.
# Then every capability is dropped (bounding set, inheritable, ambient; no new privileges), the
# grader's pid is replaced in the environment, and the command is executed. Exit 97: a mount
# failed; nothing outside the namespace changes either way.
_SETUP = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
args = sys.argv[1:]
cut = args.index("--")
ops, command = list(zip(args[:cut:2], args[1:cut:2])), args[cut + 1:]
def mount(src, target, fstype, flags, data):
    b = lambda s: None if s is None else os.fsencode(s)
    if libc.mount(b(src), b(target), b(fstype), flags, b(data)) != 0:
        err = ctypes.get_errno()
        sys.stderr.write(f"sandbox: cannot mount {target}: {os.strerror(err)}\n")
        os._exit(97)
fds = {p: os.open(p, os.O_PATH) for m, p in ops if m in ("ro", "rw")}
order = {"ro": 0, "rw": 0, "hide": 1, "scratch": 1}
BIND, REMOUNT, RDONLY = 4096, 32, 1
KEEP = {2: 2, 4: 4, 8: 8, 1024: 1024, 2048: 2048, 4096: 2097152}  # statvfs flag -> mount flag
for mode, path in sorted(ops, key=lambda op: (op[1].rstrip("/").count("/"), order[op[0]])):
    os.makedirs(path, exist_ok=True)  # its folder may be covered by now
    if mode in ("hide", "scratch"):
        data = "size=1m,mode=755" if mode == "hide" else "size=2g,mode=1777"  # memory: capped
        mount("grader-" + mode, path, "tmpfs", 2 | 4, data)  # nosuid, nodev
        continue
    mount(f"/proc/self/fd/{fds[path]}", path, None, BIND, None)
    if mode == "ro":
        st = os.statvfs(path).f_flag
        keep = sum(m for s, m in KEEP.items() if st & s)  # a user namespace must keep them
        mount(None, path, None, REMOUNT | BIND | RDONLY | keep, None)
for fd in fds.values():
    os.close(fd)
last = 0
while libc.prctl(24, last, 0, 0, 0) == 0:  # PR_CAPBSET_DROP, until EINVAL past the last one
    last += 1
libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0 or libc.prctl(38, 1, 0, 0, 0) != 0:
    sys.stderr.write("sandbox: cannot drop capabilities\n")
    os._exit(97)
os.environ["JPY_PARENT_PID"] = "1"  # not the grader's pid; ipykernel then polls no parent
os.execvp(command[0], command)
"""

# Shared scratch folders a submission could otherwise leave files in for later kernels.
SCRATCH = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))


def sandbox_prefix(
    read_only: Iterable[Path],
    hidden: Iterable[Path],
    writable: Iterable[Path] = (),
    scratch: Iterable[Path] = SCRATCH,
) -> tuple[str, ...]:
    """The command that starts a kernel in an OS sandbox: private mount and PID namespaces
    (``unshare``, util-linux; as an unprivileged user also a user namespace) with a fresh
    ``/proc``, in which ``read_only`` folders cannot be written, ``hidden`` folders look empty,
    ``scratch`` folders are empty private tmpfs, ``writable`` folders stay as they are (even
    inside a hidden or scratch folder), and the command runs without capabilities.

    Paths are made absolute here (the kernel starts in another folder); those that do not exist
    are left out. A path both hidden and kept (read-only or writable) is hidden; a kept path inside
    a hidden folder stays visible.
    """
    user = () if os.geteuid() == 0 else ("--user", "--map-root-user")
    ops: list[str] = []
    for mode, paths, exists in (
        ("ro", read_only, Path.is_dir),
        ("rw", writable, Path.is_dir),
        ("hide", hidden, Path.is_dir),
        ("scratch", scratch, Path.is_dir),
    ):
        for p in paths:
            if exists(Path(p)):
                ops += [mode, str(Path(p).resolve())]
    return (
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        *user,
        sys.executable,
        "-I",
        "-S",
        "-c",
        _SETUP,
        *ops,
        "--",
    )


_sandbox_checked: tuple[bool, str] | None = None


def sandbox_available() -> tuple[bool, str]:
    """Whether :func:`sandbox_prefix` works on this machine (tried once per process), and why not.

    It needs ``unshare`` and the right to make mount and PID namespaces: root, or user namespaces
    enabled for unprivileged users (most Linux distributions). Not on macOS or Windows. The trial
    checks that a hidden file is invisible, that a read-only folder refuses writes, that the
    process is PID 1 of its own namespace, and that it cannot mount.
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
                (Path(tmp) / "ro").mkdir()
                (Path(tmp) / "secret").mkdir()
                (Path(tmp) / "secret" / "x").write_text("x")
                probe = (
                    "import ctypes, os, sys\n"
                    "t = sys.argv[1]\n"
                    "assert not os.listdir(t + '/secret'), 'a hidden folder is visible'\n"
                    "try:\n"
                    "    open(t + '/ro/f', 'w')\n"
                    "    raise SystemExit('a read-only folder is writable')\n"
                    "except OSError:\n"
                    "    pass\n"
                    "assert os.getpid() == 1, 'no PID namespace'\n"
                    "umount = ctypes.CDLL(None).umount2\n"
                    "assert umount((t + '/secret').encode(), 2) != 0, 'the sandbox can be undone'\n"
                )
                cmd = [
                    *sandbox_prefix([Path(tmp) / "ro"], [Path(tmp) / "secret"], scratch=()),
                    sys.executable,
                    "-c",
                    probe,
                    tmp,
                ]
                try:
                    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                    ok = done.returncode == 0
                    why = "" if ok else _last_line(done.stderr or f"exit status {done.returncode}")
                except (OSError, subprocess.TimeoutExpired) as exc:
                    ok, why = False, first_line(str(exc))
            _sandbox_checked = (ok, why)
    return _sandbox_checked


def _last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return first_line(lines[-1] if lines else text)


# What a grading run hides, shows read-only and gives as scratch space (grader.grade).

def hidden_repo_folders(root: Path | None = None) -> list[Path]:
    """The folders of a course checkout ``root`` (default: the one grading) a submission's kernel
    must not see: every top-level folder except ``helpers`` (the package it imports),
    ``results`` (committed measurements the notebooks show), package metadata (``*.egg-info``)
    and any folder holding this Python environment or ``$COURSE_DATA_DIR``. So the solution
    notebooks, the right answers in tests/, and any other copy of them in the checkout (an old
    checkout, a backup) look empty, whatever their names."""
    root = REPO_ROOT if root is None else root
    keep = {root / "helpers", root / "results"}
    needed = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()]
    data = os.environ.get("COURSE_DATA_DIR", "").strip()
    if data:
        needed.append(Path(data).resolve())
    hidden = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        inside = [n for n in needed if n == folder.resolve() or folder.resolve() in n.parents]
        if folder not in keep and not inside and not folder.name.endswith(".egg-info"):
            hidden.append(folder)
    return hidden


DIST_NAME = "fast-gpt2-course"  # pyproject.toml's [project] name


def installed_checkouts() -> list[Path]:
    """The course checkouts this Python environment was installed from, other than the one
    grading: the source folder pip records in the distribution's ``direct_url.json`` (PEP 610,
    written by ``pip install -e DIR`` and ``pip install DIR``). An editable install's checkout is
    named in the environment's ``site-packages`` (the editable finder's mapping), so a
    submission can find it and read its solutions unless it is hidden as well."""
    import json
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    try:
        text = metadata.distribution(DIST_NAME).read_text("direct_url.json")
        url = urlparse(json.loads(text or "{}").get("url", ""))
    except (metadata.PackageNotFoundError, ValueError, AttributeError):
        return []
    if url.scheme != "file":
        return []
    folder = Path(unquote(url.path)).resolve()
    return [folder] if folder.is_dir() and folder != REPO_ROOT.resolve() else []


def needed_paths() -> list[Path]:
    """What a submission's kernel must be able to read: the checkout, this Python environment
    and its base installation, the site-packages folders, ``$PYTHONPATH``, ``$COURSE_DATA_DIR``
    and the Hugging Face cache."""
    import site

    paths = [REPO_ROOT, Path(sys.prefix), Path(sys.base_prefix), kernel.hf_home()]
    paths += [Path(p) for p in [*site.getsitepackages(), site.getusersitepackages()]]
    paths += [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    data = os.environ.get("COURSE_DATA_DIR", "").strip()
    if data:
        paths.append(Path(data))
    return [p.resolve() for p in paths if p.is_dir()]


def git_stores(root: Path | None = None) -> list[Path]:
    """The git object stores of a checkout ``root`` (default: the one grading) when it is a
    worktree or a submodule (its ``.git`` is a file naming them): they hold every committed
    solution."""
    root = REPO_ROOT if root is None else root
    dot_git = root / ".git"
    if not dot_git.is_file():
        return []  # a plain checkout: .git is a top-level folder, hidden_repo_folders has it
    text = dot_git.read_text(errors="replace").strip()
    if not text.startswith("gitdir:"):
        return []
    gitdir = (root / text.split(":", 1)[1].strip()).resolve()
    common = gitdir / "commondir"
    stores = [gitdir]
    if common.is_file():
        stores.append((gitdir / common.read_text().strip()).resolve())
    return [s for s in stores if s.is_dir()]


def system_folders() -> list[Path]:
    """The top-level folders of ``/`` but ``/proc``, ``/sys``, ``/dev`` and ``/tmp`` (which the
    sandbox mounts afresh or as scratch) and links (``/bin`` -> ``usr/bin``): made read-only for
    a sandboxed kernel."""
    own = {"proc", "sys", "dev", "tmp"}
    try:
        return sorted(p for p in Path("/").iterdir()
                      if p.name not in own and p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def sandbox_paths(submissions: Path, reference: Path, out: Path | None) -> dict[str, list[Path]]:
    """:func:`sandbox_prefix`'s ``read_only``, ``hidden`` and ``scratch`` paths for grading:
    read-only, what the kernel needs (:func:`needed_paths`) and every system folder
    (:func:`system_folders`); hidden, the reference and
    submissions folders, the other folders (:func:`hidden_repo_folders`) and git stores of the
    checkout and of any other checkout the environment was installed from
    (:func:`installed_checkouts`, which is read-only as well), the teacher's home and the folder
    of ``out`` (read-only instead when it holds something the kernel needs); private and empty,
    ``/tmp``, ``/var/tmp``, ``/dev/shm`` and this process's temporary folder."""
    needed = needed_paths()
    home = Path.home().resolve()
    hidden = [reference, submissions]
    others = installed_checkouts()
    for root in (REPO_ROOT, *others):
        hidden += [*hidden_repo_folders(root), *git_stores(root)]
    hidden += [home] if len(home.parts) > 1 else []  # never "/" (HOME=/ in some containers)
    # read-only too: a later grading run from that checkout imports its checks from there; and
    # every other top-level folder, so that a kernel run as root (uid 0 owns /usr, /etc, /opt)
    # cannot plant a program or /etc/ld.so.preload that the grader would run outside the sandbox
    read_only = [*needed, *others, *system_folders()]
    if out is not None:
        folder = out.parent.resolve()
        holds_needed = any(folder == n or folder in n.parents for n in needed)
        (read_only if holds_needed else hidden).append(folder)
    scratch = [*SCRATCH, Path(tempfile.gettempdir())]  # the kernel's own folder is kept in it
    return {"read_only": read_only, "hidden": hidden, "scratch": scratch}
