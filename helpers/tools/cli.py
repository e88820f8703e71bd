"""Small checks shared by the course's command-line tools
(``python -m helpers.chapters.ch04_precision`` ...).

A user error (a GPU asked for where there is none, an output path that is a folder, a count of 0,
a file that is not what it should be) ends in one line ``error: ...`` and exit status 2, checked
before any long run starts, never in a traceback after it.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

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
    except RuntimeError as e:
        raise ValueError(
            f"unknown device {value!r}: this is not a device name; use 'cpu', 'cuda' or 'cuda:N' "
            f"({str(e).splitlines()[0][:80]})"
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


def out_path(
    path: str | Path | None, flag: str = "--out", suffix: str | None = None
) -> Path | None:
    """An output file path, checked before the run: its folder is created; a folder is refused;
    a new file is created and removed again, so a place that refuses new files fails now; with
    ``suffix`` (e.g. ".png") the name must end in it.

    Raises:
        ValueError: ``path`` is an existing folder, its folder cannot be made (a file is in the
            way), that folder or the file is not writable, or its name lacks ``suffix``.
    """
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        example = path / ("results.json" if flag == "--out" else "ladder.png")
        raise ValueError(f"{flag} {path} is a folder: give a file name, e.g. {example}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(
            f"{flag} {path}: cannot make its folder {path.parent} ({e.strerror or e}): "
            "choose a path in a writable folder"
        ) from None
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"{flag} {path} is not writable here: choose a path in a writable folder")
    if suffix is not None and path.suffix.lower() != suffix:
        raise ValueError(
            f"{flag} {path}: the file is written as {suffix[1:].upper()}, so its name "
            f"must end in {suffix} (e.g. {path.with_suffix(suffix).name})"
        )
    if not path.exists():  # try it now, not after the run: some folders refuse new files
        try:
            path.open("x").close()
            path.unlink()
        except OSError as e:
            raise ValueError(
                f"{flag} {path}: cannot create a file there ({e.strerror or e}): "
                "choose a path in a writable folder"
            ) from None
    return path


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
