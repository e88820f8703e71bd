"""Small checks shared by the course's command-line tools
(``python -m helpers.chapters.ch04_precision`` ...).

A user error (a GPU asked for where there is none, an output path that is a folder, a count of 0,
a file that is not what it should be) ends in one line ``error: ...`` and exit status 2, checked
before any long run starts, never in a traceback after it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

import torch


def device(value: str | torch.device | None) -> torch.device:
    """The device a tool was asked for (None: CUDA if available, else the CPU).

    Raises:
        ValueError: an unknown device string, a device type other than cpu/cuda, or CUDA asked for
            where PyTorch sees no CUDA GPU.
    """
    from helpers.measure import hardware

    if value is None:
        return hardware.default_device()
    try:
        dev = torch.device(value)
    except RuntimeError:
        raise ValueError(
            f"unknown device {value!r}: this is not a device name; use 'cpu', 'cuda' or 'cuda:N'"
        ) from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"the course runs on 'cpu' or 'cuda', not {dev.type!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"--device {value} asked, but this PyTorch sees no CUDA GPU: "
            "use --device cpu (a CPU-only build, or no driver)"
        )
    hardware.apply_env_emulation_once(dev)  # $COURSE_EMULATE_GPU holds for --device cuda too
    return dev


def _committed_results(folder: Path) -> bool:
    """Whether ``folder`` is the ``results/`` folder of a checkout of the course (a ``results``
    folder beside ``helpers/__init__.py``): this checkout's, or another one's, such as a second
    clone the installed package was not built from."""
    return folder.name == "results" and (folder.parent / "helpers" / "__init__.py").is_file()


def csv_has_header(path: Path, columns: Iterable[str]) -> bool:
    """Whether the first line of ``path`` is exactly ``columns`` joined by commas (a CSV that the
    tool with those columns wrote); False for anything unreadable."""
    try:
        with open(path, newline="") as f:
            return f.readline().strip() == ",".join(columns)
    except (OSError, UnicodeDecodeError):
        return False


def out_path(
    path: str | Path | None,
    flag: str = "--out",
    suffix: str | None = None,
    *,
    force: bool = False,
    same_kind: Callable[[Path], bool] | None = None,
    what: str = "",
    folders: dict[Path, str] | None = None,
    png_kind: str | None = None,
) -> Path | None:
    """An output file path, checked before the run by the one rule every tool that writes files
    follows (the ladder, the chapter tools, ``grade``, ``leaderboard``):

    - never a notebook's name (``.ipynb``), a path inside one of ``folders`` ({folder: what it
      holds}, e.g. the submissions), or an existing folder;
    - with ``suffix`` (e.g. ".png") the name must end in it;
    - an existing file in a checkout's ``results/`` (a committed measurement, e.g. of the H200;
      this checkout's or any other course checkout's) is replaced only with ``force``;
    - an existing file is replaced only when ``same_kind(path)`` recognises it as an earlier
      output of the same kind (a JSON result of the same tool, :func:`result_out`; a grades
      CSV; for ".png" a figure :func:`helpers.measure.plots.save_png` wrote as ``png_kind``, the
      same tool's), or with ``force``:
      the message then ends "pass --force to replace it" (``what`` says what the file is not);
    - its folder is created, and a new file is created and removed again, so a place that refuses
      new files fails now, not after the run.

    Raises:
        ValueError: any of the above, or a path the system cannot follow (a symlink loop, a name
            too long), with a one-line reason.
    """
    if path is None:
        return None
    try:
        return _out_path(Path(path), flag, suffix, force, same_kind, what, folders, png_kind)
    except (OSError, RuntimeError) as e:  # Path.resolve raises RuntimeError on a symlink loop
        raise ValueError(f"{flag} {path}: cannot use this path ({e}): choose another") from None


def _out_path(
    path: Path,
    flag: str,
    suffix: str | None,
    force: bool,
    same_kind: Callable[[Path], bool] | None,
    what: str,
    folders: dict[Path, str] | None,
    png_kind: str | None,
) -> Path:
    """:func:`out_path`'s checks, for a path that is not None."""
    if path.suffix.lower() == ".ipynb":
        raise ValueError(f"{flag} {path} is a notebook's name: give a {suffix or '.json'} file")
    where = path.resolve()
    for folder, holds in (folders or {}).items():
        if folder.resolve() == where or folder.resolve() in where.parents:
            raise ValueError(
                f"{flag} {path} lies in the {holds} folder {folder}: write it elsewhere"
            )
    if path.is_dir():
        example = path / ("results.json" if flag == "--out" else "ladder.png")
        raise ValueError(f"{flag} {path} is a folder: give a file name, e.g. {example}")
    if suffix is not None and path.suffix.lower() != suffix:
        raise ValueError(
            f"{flag} {path}: the file is written as {suffix[1:].upper()}, so its name "
            f"must end in {suffix} (e.g. {path.with_suffix(suffix).name})"
        )
    if same_kind is None and suffix == ".png":
        from helpers.measure import plots

        def same_kind(p: Path) -> bool:
            return plots.is_course_png(p, png_kind)

        what = what or " and is not a figure this tool wrote"
    if (path.exists() or path.is_symlink()) and not force:
        if any(_committed_results(folder) for folder in where.parents):
            raise ValueError(
                f"{flag} {path} is a committed result (results/): a new run would replace its "
                "measurement; write elsewhere, or pass --force to replace it"
            )
        if not (same_kind is not None and path.is_file() and same_kind(path)):
            raise ValueError(f"{flag} {path} exists{what}: pass --force to replace it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(
            f"{flag} {path}: cannot make its folder {path.parent} ({e.strerror or e}): "
            "choose a path in a writable folder"
        ) from None
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"{flag} {path} is not writable here: choose a path in a writable folder")
    if not path.exists():  # try it now, not after the run: some folders refuse new files
        try:
            path.open("x").close()
            path.unlink(missing_ok=True)
        except FileExistsError:
            pass  # another process made it meanwhile: the folder takes new files
        except OSError as e:
            raise ValueError(
                f"{flag} {path}: cannot create a file there ({e.strerror or e}): "
                "choose a path in a writable folder"
            ) from None
    return path


def json_with_keys(*keys: str) -> Callable[[Path], bool]:
    """A ``same_kind`` test for :func:`out_path`: is the file a JSON object (at most 64 MiB)
    holding all of ``keys``?"""

    def test(path: Path) -> bool:
        try:
            if path.stat().st_size > 64 << 20:
                return False
            data = json.loads(path.read_text())
        # UnicodeDecodeError and JSONDecodeError are ValueErrors; a deeply nested file recurses
        except (OSError, ValueError, RecursionError):
            return False
        return isinstance(data, dict) and all(k in data for k in keys)

    return test


# The keys every course result starts with (helpers.measure.results.provenance); a tool's own
# result holds these and its own keys (result_out's ``keys``).
PROVENANCE = ("device", "torch", "date")
is_course_result = json_with_keys(*PROVENANCE)


def result_out(
    path: str | Path | None,
    kind: tuple[str, ...],
    flag: str = "--out",
    force: bool = False,
    provenance: bool = True,
    what: str = " and is not a result JSON of this tool",
) -> Path | None:
    """:func:`out_path` for a JSON result: the name ends in .json, and an existing file is
    replaced only when it is a JSON object holding the tool's own keys ``kind`` (e.g. the
    ladder's "rungs") and, with ``provenance``, :data:`PROVENANCE`; or with ``force``. So one
    tool's ``--out`` does not replace another tool's result (``what`` ends the refusal)."""
    keys = (PROVENANCE if provenance else ()) + tuple(kind)
    return out_path(path, flag, ".json", force=force, same_kind=json_with_keys(*keys), what=what)


def add_force(parser: argparse.ArgumentParser, what: str = "--out") -> None:
    """The ``--force`` option of a tool whose outputs :func:`out_path` checks."""
    parser.add_argument(
        "--force",
        action="store_true",
        help=f"replace an existing {what} file that is not an earlier output of this kind",
    )


def replace_file(path: Path, write: Callable[[IO[str]], None]) -> None:
    """Write a text file atomically: ``write(f)`` fills a new file that this process creates next
    to ``path`` (O_EXCL, so never an existing file or a planted symlink), which then replaces
    ``path`` (``os.replace``: a symlink at ``path`` is replaced, never followed)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            write(f)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # as open() would have made it
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def at_least(name: str, value: int | None, minimum: int = 1) -> None:
    """Raise ValueError("--name must be >= minimum") unless ``value`` is None or >= ``minimum``."""
    if value is not None and value < minimum:
        raise ValueError(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")


def guarded(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a tool's ``main``: ValueError and OSError (user errors: bad values, missing or
    unreadable files, malformed JSON) become ``error: ...`` on stderr and exit status 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except (ValueError, OSError) as e:  # json.JSONDecodeError is a ValueError
            kind = "not valid JSON: " if isinstance(e, json.JSONDecodeError) else ""
            print(f"error: {kind}{e}", file=sys.stderr)
            return 2

    return wrapper
