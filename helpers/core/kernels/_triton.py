"""What the package's Triton kernels share: the Triton import, whether they can run, their launch.

Triton is imported lazily: on a CPU-only install without the ``triton`` package, importing
``helpers`` still works (``triton`` and ``tl`` are None here) and :func:`available` says why the
kernels cannot run. The kernels are registered with ``torch.library.triton_op`` and launched
through ``wrap_triton`` (torch >= 2.6); on an older torch the package still imports and
:func:`available` says why the Triton rungs are skipped (:data:`TRITON_OP_MISSING`). So the kernel
modules define their kernels only under ``if triton is not None and TRITON_OP_MISSING is None:``.

With ``TRITON_INTERPRET=1`` set before ``helpers.core.kernels`` is imported, Triton's interpreter
runs the same kernels on CPU tensors (slowly): that is how CI tests them on a machine without a
GPU.
"""

from __future__ import annotations

import os

import torch

try:  # pragma: no cover - which branch runs depends on the install
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch ships without Triton
    triton = None
    tl = None


# None where torch.library has triton_op and wrap_triton (torch >= 2.6), else why the kernels
# cannot run.
TRITON_OP_MISSING: str | None = (
    None
    if all(hasattr(torch.library, name) for name in ("triton_op", "wrap_triton"))
    else (
        f"torch {torch.__version__} has no torch.library.triton_op (torch >= 2.6 has it): "
        "the Triton kernels need a newer torch"
    )
)

# True when Triton's CPU interpreter runs the kernels (TRITON_INTERPRET=1). Triton reads the
# variable when the kernels are decorated, at import, so this module reads it then too.
_INTERPRETED_AT_IMPORT = os.environ.get("TRITON_INTERPRET", "0") == "1"


def available(device: torch.device | str) -> tuple[bool, str]:
    """(whether the Triton cross-entropy kernels can run on ``device``, the reason if not).

    It needs the ``triton`` package and a CUDA GPU of compute capability >= 7.0 (Triton's minimum),
    or a CPU when ``TRITON_INTERPRET=1`` was set before ``helpers.core.kernels`` was imported
    (tests).
    """
    device = torch.device(device)
    from helpers.measure import hardware

    if device.type == "cuda" and hardware.from_datasheet():  # a GPU asked about, not present
        cap = hardware.capability(device)
        if cap < (7, 0):
            return False, f"Triton needs compute capability >= 7.0; this GPU is {cap}"
        return True, ""
    if device.type not in ("cuda", "cpu") or (device.type == "cpu" and not _INTERPRETED_AT_IMPORT):
        return (
            False,
            f"the Triton kernels run on a CUDA GPU; this device is a {device.type.upper()}",
        )
    if triton is None:
        return (
            False,
            "the 'triton' package is not installed (it comes with the CUDA builds of torch)",
        )
    if TRITON_OP_MISSING is not None:
        return False, TRITON_OP_MISSING
    if device.type == "cuda" and not torch.cuda.is_available():
        return False, "no CUDA GPU is available here (torch.cuda.is_available() is False)"
    if device.type == "cuda":
        cap = hardware.capability(device)
        if cap < (7, 0):
            return False, f"Triton needs compute capability >= 7.0; this GPU is {cap}"
        return True, ""
    return True, ""  # a CPU with TRITON_INTERPRET=1 set before import (tests)


def launch(kernel):
    """``kernel`` to launch as ``launch(kernel)[grid](...)`` inside a ``torch.library.triton_op``.

    ``wrap_triton`` lets torch.compile trace the launch; the CPU interpreter's kernels are plain
    Python functions that older torch (2.11) refuses to wrap, and compile is not used with them.
    """
    return kernel if _INTERPRETED_AT_IMPORT else torch.library.wrap_triton(kernel)


def autotuned(kernel, configs: list[dict], key: list[str]):
    """``kernel`` autotuned over ``configs``: each a dict of the kernel's constexpr meta-parameters
    plus ``num_warps`` (how the kernel modules list their configs, so tests and benchmarks can
    launch each one as it is). Autotune times every config at the first call for each value of
    the ``key`` arguments and keeps the fastest (``triton.autotune``)."""
    return triton.autotune(
        [
            triton.Config({k: v for k, v in c.items() if k != "num_warps"}, c["num_warps"])
            for c in configs
        ],
        key=key,
    )(kernel)
