"""The CUDA caching allocator: allocated against reserved memory, what ``empty_cache`` does and
does not do, and fragmentation made to happen.

PyTorch asks CUDA for memory in *segments* (cudaMalloc) and hands *blocks* of them to tensors; a
freed block goes back to the allocator's cache, not to CUDA, so the next tensor of that size costs
no cudaMalloc (https://pytorch.org/docs/stable/notes/cuda.html#memory-management):

- **allocated** (``torch.cuda.memory_allocated``): bytes of the blocks tensors hold;
- **reserved** (``torch.cuda.memory_reserved``): bytes of every segment, allocated plus cached;
- ``torch.cuda.empty_cache()`` gives CUDA back the segments that hold no allocated block. It frees
  no tensor, and a segment that still holds one live block stays whole.

**Fragmentation**: free bytes that lie in segments between live blocks can only serve requests
that fit in one gap. When a larger request finds no gap and no room for a new segment under the
memory limit, the allocator frees its wholly free segments and retries, then raises
``torch.cuda.OutOfMemoryError``, although reserved minus allocated is larger than the request.
With ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` a stream's memory is one virtual range
that grows by mapping physical pages, and freeing cached memory unmaps the pages of its gaps, so
the same request succeeds (the setting is read when CUDA starts: it needs a fresh process,
:func:`run_fragmentation`).

``python -m helpers.measure.allocator fragment [--cap-bytes N]`` runs the pattern in this process
and prints one JSON line.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable

import torch

import helpers
from helpers.measure import snapshot
from helpers.tools import cli

MiB = 2**20
EXPANDABLE_ENV = "PYTORCH_CUDA_ALLOC_CONF"

# stats(): our name -> the memory_stats key (bytes or counts, all pools of the device)
STAT_KEYS = {
    "allocated": "allocated_bytes.all.current",
    "reserved": "reserved_bytes.all.current",
    "requested": "requested_bytes.all.current",
    "inactive_split": "inactive_split_bytes.all.current",
    "peak_allocated": "allocated_bytes.all.peak",
    "peak_reserved": "reserved_bytes.all.peak",
    "segments": "segment.all.current",
    "alloc_retries": "num_alloc_retries",
    "ooms": "num_ooms",
}


def stats(device: torch.device | str) -> dict[str, int] | None:
    """The caching allocator's counters of a CUDA ``device`` (``torch.cuda.memory_stats``), by the
    names of :data:`STAT_KEYS`: bytes allocated to tensors, reserved in segments, requested by the
    tensors (before rounding up), ``inactive_split`` (free bytes inside segments that also hold
    live blocks: the fragmented part), the peaks since the last reset, the number of segments,
    of cudaMalloc retries after freeing the cache, and of out-of-memory errors. None on a CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    raw = torch.cuda.memory_stats(device)
    return {name: int(raw.get(key, 0)) for name, key in STAT_KEYS.items()}


class PhaseStats:
    """A ``ranges`` factory for :func:`helpers.measure.profiler.step_with_ranges` that measures
    each phase of a step on CUDA: before it, the peak statistics are reset (so the peak is the
    phase's own) and the :class:`helpers.measure.snapshot.Markers` given, if any, mark it. ``rows``:
    one dict per phase: "phase" (``prefix`` + name), "allocated_start", "peak", "allocated_end",
    "reserved_end", "requested_peak" (bytes). On a CPU only the markers run and ``rows`` stays
    empty (there are no counters: read the phases from a snapshot's timeline instead)."""

    def __init__(self, device: torch.device | str, markers: snapshot.Markers | None = None):
        self.device, self.markers = torch.device(device), markers
        self.rows: list[dict] = []
        self._prefix = ""

    @property
    def prefix(self) -> str:
        return self._prefix

    @prefix.setter
    def prefix(self, value: str) -> None:
        self._prefix = value
        if self.markers is not None:
            self.markers.prefix = value

    @contextlib.contextmanager
    def __call__(self, name: str):
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            start = torch.cuda.memory_allocated(self.device)
        if self.markers is not None:
            self.markers.mark(name)
        yield
        if cuda:
            s = stats(self.device)
            self.rows.append(
                {
                    "phase": self._prefix + name,
                    "allocated_start": start,
                    "peak": s["peak_allocated"],
                    "allocated_end": s["allocated"],
                    "reserved_end": s["reserved"],
                    "requested_peak": int(
                        torch.cuda.memory_stats(self.device)["requested_bytes.all.peak"]
                    ),
                }
            )


def empty_cache_effect(device: torch.device | str, release: Callable[[], None]) -> list[dict]:
    """What ``torch.cuda.empty_cache()`` gives back, in four moments: {"when", "allocated",
    "reserved", "segments"} (bytes) now; after ``empty_cache()`` while the caller's tensors live;
    after ``release()`` (the caller drops its references) and ``gc.collect()``; after
    ``empty_cache()`` again.

    Raises:
        ValueError: on a CPU (no caching allocator there).
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError("empty_cache acts on the CUDA caching allocator: run it on a GPU")
    rows = []

    def note(when: str) -> None:
        torch.cuda.synchronize(device)
        s = stats(device)
        rows.append({"when": when, **{k: s[k] for k in ("allocated", "reserved", "segments")}})

    note("after the step")
    torch.cuda.empty_cache()
    note("empty_cache(), tensors still referenced")
    release()
    gc.collect()
    note("references dropped")
    torch.cuda.empty_cache()
    note("empty_cache() again")
    return rows


# --------------------------------------------------------------------------------------------
# Fragmentation made to happen
# --------------------------------------------------------------------------------------------

PAGE = 20 * MiB  # the pattern's sizes are multiples of this (the expandable segments' page size)


def fragmentation_pattern(
    cap_bytes: int | None = None, device: torch.device | str = "cuda", pieces: int = 16
) -> dict:
    """In this process, make free memory useless by scattering it, then ask for a block larger
    than any gap.

    With a memory limit of ``cap_bytes`` (default: the GPU's memory;
    ``torch.cuda.set_per_process_memory_fraction``) and a piece of p = cap/``pieces`` bytes
    (rounded down to :data:`PAGE`): one tensor of (pieces - 1)·p is made and freed (one cached
    segment), then pieces - 1 tensors of p are carved out of it, every second one is freed (the
    gaps, each between two live tensors), and 2·p bytes are asked for. Without expandable segments
    no gap fits, the limit leaves no room for a new segment and no segment is wholly free to give
    back: out of memory, with reserved - allocated about (pieces/2 - 1)·p. Where less physical
    memory is free than the pattern needs (another process holds some), the limit is lowered to fit
    it (``cap_lowered``).

    Returns {"status": "measured", "expandable_segments", "cap_bytes", "piece_bytes",
    "request_bytes", "before" (allocated, reserved, free_in_segments, largest_free, fragmentation,
    inactive_split), "outcome" ("fits" or "out of memory"), "error" (the OOM message, its first
    1000 characters), "after" (allocated, reserved, peak_reserved, alloc_retries, ooms),
    "cap_lowered"}; bytes throughout.

    Raises:
        ValueError: no CUDA GPU, or a limit too small for pieces of at least :data:`PAGE`.
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError("the fragmentation pattern needs the CUDA caching allocator: run on a GPU")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    cap = min(cap_bytes or total, total)
    free_now = torch.cuda.mem_get_info(device)[0]
    lowered = (pieces - 1) * (cap // pieces) > free_now - 2**30
    if lowered:  # the big segment must really fit: leave 1 GiB for CUDA's own needs
        cap = (free_now - 2**30) * pieces // (pieces - 1)
    piece = (cap // pieces) // PAGE * PAGE
    if piece < PAGE:
        raise ValueError(f"a cap of {cap} bytes is too small: pieces of {PAGE} bytes at least")
    torch.cuda.set_per_process_memory_fraction(cap / total, device)

    def empty(n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.uint8, device=device)

    whole = empty((pieces - 1) * piece)
    del whole  # one segment of (pieces - 1) pieces, cached
    kept: list[torch.Tensor | None] = [empty(piece) for _ in range(pieces - 1)]
    for i in range(1, pieces - 2, 2):
        kept[i] = None  # a gap of one piece between two live tensors
    s = stats(device)
    seg = snapshot.segment_summary(torch.cuda.memory._snapshot(), device.index)
    before = {
        "allocated": s["allocated"],
        "reserved": s["reserved"],
        "free_in_segments": s["reserved"] - s["allocated"],
        "largest_free": seg["largest_free"],
        "fragmentation": seg["fragmentation"],
        "inactive_split": s["inactive_split"],
    }
    outcome, error, extra = "fits", None, None
    try:
        extra = empty(2 * piece)
    except torch.cuda.OutOfMemoryError as e:
        outcome, error = "out of memory", str(e)[:1000]
    s = stats(device)
    expandable = any(x.get("is_expandable") for x in torch.cuda.memory._snapshot()["segments"])
    del extra, kept
    return {
        "status": "measured",
        "expandable_segments": expandable,
        "alloc_conf": os.environ.get(EXPANDABLE_ENV, ""),
        "cap_bytes": cap,
        "cap_lowered": lowered,
        "piece_bytes": piece,
        "request_bytes": 2 * piece,
        "before": before,
        "outcome": outcome,
        "error": error,
        "after": {
            k: s[k] for k in ("allocated", "reserved", "peak_reserved", "alloc_retries", "ooms")
        },
    }


def run_fragmentation(expandable: bool, cap_bytes: int | None = None, timeout_s: int = 300) -> dict:
    """:func:`fragmentation_pattern` in a fresh Python process with
    ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (or ``:False``): the allocator reads the
    setting when CUDA starts, so it cannot change inside a running process. The child is not
    emulating a GPU (``$COURSE_EMULATE_GPU`` is removed); pass the emulated GPU's memory as
    ``cap_bytes``. Free this process's GPU memory first (``torch.cuda.empty_cache()``): the child
    shares the GPU.

    Returns the child's JSON (see :func:`fragmentation_pattern`); {"status": "needs CUDA",
    "reason"} without a CUDA GPU (nothing is run); {"status": "failed", "error"} when the child
    fails or runs past ``timeout_s``.
    """
    if not torch.cuda.is_available():
        return {
            "status": "needs CUDA",
            "reason": (
                "the fragmentation pattern runs on the CUDA caching allocator: on a GPU it makes "
                "an allocation fail with reserved memory to spare, then succeed with expandable "
                "segments, each in a fresh process"
            ),
        }
    from helpers.measure import hardware

    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", hardware.EMULATE_ENV)
    }
    env[EXPANDABLE_ENV] = f"expandable_segments:{'True' if expandable else 'False'}"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(helpers.REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]
    )
    cmd = [sys.executable, "-m", "helpers.measure.allocator", "fragment"]
    if cap_bytes is not None:
        cmd += ["--cap-bytes", str(int(cap_bytes))]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": f"the pattern ran past {timeout_s} s"}
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"status": "failed", "error": (out.stderr.strip() or out.stdout.strip())[-1000:]}
    return json.loads(lines[-1])


@cli.guarded
def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.measure.allocator fragment [--cap-bytes N]``: one JSON line."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m helpers.measure.allocator",
        description="The caching allocator's fragmentation pattern, in this process (JSON).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fragment", help="scatter free memory, then ask for more than any gap")
    f.add_argument("--cap-bytes", type=int, default=None, help="memory limit (default: the GPU's)")
    args = p.parse_args(argv)
    cli.at_least("cap_bytes", args.cap_bytes)
    print(json.dumps(fragmentation_pattern(args.cap_bytes)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
