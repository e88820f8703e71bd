"""Memory snapshots: every block the allocator handed out and took back while code ran, and what
was alive at the peak.

PyTorch records each allocation and free of its CUDA caching allocator when asked
(``torch.cuda.memory._record_memory_history``) and returns them with the allocator's segments
(``torch.cuda.memory._snapshot()``); the format is documented in that function's docstring and at
https://pytorch.org/docs/stable/torch_cuda_memory.html. A snapshot is a plain dict:

- ``segments``: one per cudaMalloc'd segment: ``address``, ``total_size`` (bytes), ``device``,
  ``blocks``, each with ``size`` (bytes, rounded up by the allocator), ``requested_size`` (bytes
  the tensor asked for), ``state`` ("active_allocated", "active_pending_free" or "inactive") and
  ``frames`` (the Python stack that allocated it);
- ``device_traces``: per device, the allocator's actions in order, each with ``action`` ("alloc",
  "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
  "segment_unmap", "oom", "snapshot"), ``addr``, ``size`` (for alloc and free: the *requested*
  bytes) and ``frames``.

Three jobs, one section each:

1. **Capture** (:func:`record`). CUDA: the allocator's own history. A CPU has no caching
   allocator: there ``torch.profiler`` (``profile_memory=True``) records the step and PyTorch's
   ``torch.cuda._memory_viz._profile_to_snapshot`` turns it into the same format, with exact bytes
   and no segments or rounding; a tensor the memory profiler cannot tie to an operator is left
   out, so the CPU trace is an approximation. :class:`Markers` writes the step's phases into the
   trace itself.
2. **Reading** (plain Python on the dict, tested on fake snapshots): :func:`timeline` (bytes
   allocated after every event, the peak, the phases), :func:`live_at` (the blocks alive at one
   event), :func:`attribute` (bytes per category), :func:`segment_summary` (reserved, allocated,
   free, largest free block, fragmentation).
3. **Rendering**: :func:`write_viewer` (PyTorch's interactive ``trace_plot`` page and the pickle
   that https://pytorch.org/memory_viz opens) and :func:`segments_text` (PyTorch's ``segsum``).
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from helpers.measure import profiler  # noqa: F401  (its import keeps Kineto's stderr lines quiet)

ALLOC, FREE = "alloc", "free_requested"  # the two actions that change the allocated bytes

# --------------------------------------------------------------------------------------------
# 1. Capture
# --------------------------------------------------------------------------------------------

MARKER_BASE = 4001  # bytes: the i-th marker is a uint8 tensor of MARKER_BASE + 2*i bytes


class Markers:
    """Phase markers written into the allocator's trace: :meth:`mark` allocates and at once frees
    a uint8 tensor whose odd size (:data:`MARKER_BASE` + 2·i bytes, no real tensor of the step has
    it) names the phase, so the trace itself says where each phase starts, on CUDA and on a CPU.
    An instance is also a ``ranges`` factory for
    :func:`helpers.measure.profiler.step_with_ranges`: ``markers(name)`` marks, then runs the phase.
    ``sizes``: {marker bytes: phase name}. ``prefix`` is put before every name (e.g. "2:" for the
    second step)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.sizes: dict[int, str] = {}
        self.prefix = ""

    def mark(self, name: str) -> None:
        size = MARKER_BASE + 2 * len(self.sizes)
        self.sizes[size] = self.prefix + name
        torch.zeros(size, dtype=torch.uint8, device=self.device)  # allocated, then freed at once

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.mark(name)
        yield


@dataclass
class Capture:
    """What :func:`record` returns. Bytes throughout."""

    snapshot: dict  # PyTorch's snapshot format (see the module docstring)
    device_index: int  # which entry of snapshot["device_traces"] holds this device's trace
    markers: dict[int, str]  # {marker bytes: phase name}
    result: object  # what the recorded function returned
    source: str  # "CUDA caching allocator" or "torch.profiler (CPU)"
    max_allocated: int | None = None  # torch.cuda.max_memory_allocated over the recording
    requested_peak: int | None = None  # memory_stats' requested_bytes.all.peak, same window
    reserved_peak: int | None = None  # memory_stats' reserved_bytes.all.peak, same window


def record(
    fn: Callable[[], object],
    device: torch.device | str,
    markers: Markers | None = None,
    max_entries: int = 1_000_000,
) -> Capture:
    """Run ``fn()`` with the allocator's history recorded, and return the snapshot taken right after
    (``markers``, when given, marks "after" once ``fn`` returns).

    CUDA: ``torch.cuda.memory._record_memory_history(enabled="all", context="all",
    stacks="python", max_entries=...)``, then ``torch.cuda.memory._snapshot()``; the peak
    statistics are reset first, so ``max_allocated`` is the peak of this window. CPU:
    ``torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)`` and
    ``torch.cuda._memory_viz._profile_to_snapshot`` (no counters: the peaks are None).

    Raises:
        ValueError: a device that is neither CUDA nor a CPU.
    """
    device = torch.device(device)
    sizes = markers.sizes if markers is not None else {}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=max_entries
        )
        try:
            result = fn()
            if markers is not None:
                markers.mark("after")
            torch.cuda.synchronize(device)
            snap = torch.cuda.memory._snapshot()
            stats = torch.cuda.memory_stats(device)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        return Capture(
            snap,
            index,
            dict(sizes),
            result,
            "CUDA caching allocator",
            stats.get("allocated_bytes.all.peak"),
            stats.get("requested_bytes.all.peak"),
            stats.get("reserved_bytes.all.peak"),
        )
    if device.type != "cpu":
        raise ValueError(f"memory snapshots are recorded on CUDA or a CPU, not {device.type!r}")
    from torch.cuda import _memory_viz
    from torch.profiler import ProfilerActivity, profile

    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        result = fn()
        if markers is not None:
            markers.mark("after")
    snap = _memory_viz._profile_to_snapshot(prof)
    snap["device_traces"] = [_drop_version_bumps(t) for t in snap["device_traces"]]
    # the CPU's trace is the last one (index torch.cuda.device_count(), 0 without a GPU)
    return Capture(
        snap, len(snap["device_traces"]) - 1, dict(sizes), result, "torch.profiler (CPU)"
    )


def _drop_version_bumps(trace: list[dict]) -> list[dict]:
    """The CPU trace without its in-place updates: PyTorch's memory profiler gives a tensor a new
    version at every in-place op (``exp_avg.lerp_``, ``param.addcdiv_``), which
    ``_profile_to_snapshot`` writes as a free and an allocation of the same bytes at the same
    address; no memory moves, so the three entries are dropped."""
    out: list[dict] = []
    for e in trace:
        if (
            e["action"] == ALLOC
            and len(out) >= 2
            and out[-1]["action"] == "free_completed"
            and out[-2]["action"] == FREE
            and out[-1]["addr"] == out[-2]["addr"] == e["addr"]
            and out[-1]["size"] == out[-2]["size"] == e["size"]
        ):
            del out[-2:]
            continue
        out.append(e)
    return out


# --------------------------------------------------------------------------------------------
# 2. Reading a snapshot
# --------------------------------------------------------------------------------------------


def _blocks_with_addresses(snapshot: dict, device_index: int | None) -> list[dict]:
    """Every block of the device's segments, each with its "address" (a segment's blocks lie one
    after the other from the segment's address) and its segment's "segment" address."""
    out = []
    for seg in snapshot.get("segments", []):
        if device_index is not None and seg.get("device", device_index) != device_index:
            continue
        addr = seg["address"]
        for b in seg["blocks"]:
            out.append({**b, "address": b.get("address", addr), "segment": seg["address"]})
            addr = out[-1]["address"] + b["size"]
    return out


@dataclass
class Timeline:
    """Allocated bytes through a recording, one value per allocation or free (see
    :func:`timeline`). Event indices count the allocations and frees of the window only."""

    events: list[dict]  # the window's "alloc" and "free_requested" entries, in order
    bytes: list[int]  # bytes allocated (requested sizes) right after each event
    baseline: int  # bytes allocated before the window's first event
    phases: list[tuple[int, str]]  # (index of the phase's first event, phase name), in order
    consistent: bool  # every block the trace leaves allocated is allocated in the final state
    persistent: list[dict] = field(default_factory=list)  # blocks alive through the whole window

    @property
    def peak_index(self) -> int:
        """Index of the first event at which the bytes are largest."""
        return max(range(len(self.bytes)), key=self.bytes.__getitem__)

    @property
    def peak_bytes(self) -> int:
        return self.bytes[self.peak_index] if self.bytes else self.baseline

    def phase_at(self, index: int) -> str:
        """The phase event ``index`` belongs to ("before" ahead of the first marker)."""
        name = "before"
        for start, phase in self.phases:
            if start > index:
                break
            name = phase
        return name

    def phase_peaks(self) -> dict[str, dict[str, int]]:
        """{phase: {"start": bytes just before its first event, "peak": largest bytes in it,
        "end": bytes after its last event}}, in order; a phase name that repeats is given a
        " (2)" suffix."""
        out: dict[str, dict[str, int]] = {}
        bounds = [*self.phases, (len(self.bytes), None)]
        for (start, name), (stop, _) in zip(bounds, bounds[1:]):
            key, n = name, 2
            while key in out:
                key, n = f"{name} ({n})", n + 1
            before = self.bytes[start - 1] if start > 0 else self.baseline
            inside = self.bytes[start:stop] or [before]
            out[key] = {"start": before, "peak": max(inside), "end": inside[-1]}
        return out

    def window(self, first: str, stop: str | tuple[str, ...] | None = None) -> tuple[int, int]:
        """(start, stop) event indices from the first phase named ``first`` (or starting with it,
        e.g. "2:" for every phase of step 2) up to the first later phase starting with ``stop``
        (a prefix or a tuple of them; default: the end).

        Raises:
            KeyError: no phase starts with ``first``.
        """
        starts = [i for i, name in self.phases if name.startswith(first)]
        if not starts:
            raise KeyError(f"no phase starts with {first!r}: {[n for _, n in self.phases]}")
        end = next(
            (
                i
                for i, n in self.phases
                if stop is not None and i > starts[0] and n.startswith(stop)
            ),
            len(self.bytes),
        )
        return starts[0], end

    def peak_in(self, start: int, stop: int) -> int:
        """Index of the first event with the most bytes among events start..stop-1."""
        return max(range(start, stop), key=self.bytes.__getitem__)

    def points(self, n: int = 400, start: int = 0, stop: int | None = None) -> list[list[int]]:
        """At most about ``n`` [event index, bytes] pairs of events start..stop-1 for a plot or a
        small JSON: the largest value of each run of events, so the peak is always kept."""
        stop = len(self.bytes) if stop is None else stop
        step = max(1, (stop - start) // n)
        out = []
        for lo in range(start, stop, step):
            hi = min(stop, lo + step)
            i = max(range(lo, hi), key=self.bytes.__getitem__)
            out.append([i, self.bytes[i]])
        return out


def timeline(
    snapshot: dict, device_index: int = 0, markers: dict[int, str] | None = None
) -> Timeline:
    """Bytes allocated after every allocation and free of ``snapshot``'s trace of
    ``device_index``, as the allocator counts them: an "alloc" adds its size, a "free_requested"
    takes it away (the block stops counting as allocated when it is freed, even if a stream still
    uses it); "free_completed", the segment actions, "oom" and "snapshot" change nothing.

    With ``markers`` ({bytes: phase}, from :class:`Markers`) the window starts at the first marker
    (earlier history is left out) and each marker starts a phase. The bytes allocated before the
    window (``baseline``) come from the final state: the blocks alive at the end
    ("active_allocated") minus what the window allocated and freed. ``consistent`` is False when
    the trace and the final state disagree (a block the trace leaves allocated is not, a negative
    baseline): events were lost, or the snapshot is not of the end of this trace. A history longer
    than ``max_entries`` loses its oldest events, and with them the first markers.
    """
    markers = markers or {}
    traces = snapshot.get("device_traces", [])
    trace = traces[device_index] if device_index < len(traces) else []
    first = next(
        (i for i, e in enumerate(trace) if e["action"] == ALLOC and e["size"] in markers), 0
    )
    events = [e for e in trace[first:] if e["action"] in (ALLOC, FREE)]
    phases = [
        (i, markers[e["size"]])
        for i, e in enumerate(events)
        if e["action"] == ALLOC and e["size"] in markers
    ]
    blocks = [
        b
        for b in _blocks_with_addresses(snapshot, device_index)
        if b["state"] == "active_allocated"
    ]
    live_end = sum(b.get("requested_size", b["size"]) for b in blocks)
    net = sum(e["size"] if e["action"] == ALLOC else -e["size"] for e in events)
    baseline = live_end - net
    current: dict[int, int] = {}  # address -> size, of the window's allocations not yet freed
    for e in events:
        if e["action"] == ALLOC:
            current[e["addr"]] = e["size"]
        else:
            current.pop(e["addr"], None)
    persistent = [b for b in blocks if b["address"] not in current]
    at_end = {b["address"]: b.get("requested_size", b["size"]) for b in blocks}
    consistent = baseline >= 0 and all(at_end.get(a) == size for a, size in current.items())
    values, now = [], baseline
    for e in events:
        now += e["size"] if e["action"] == ALLOC else -e["size"]
        values.append(now)
    return Timeline(events, values, baseline, phases, consistent, persistent)


def _block(address: int, size: int, phase: str, frames: list, index: int | None) -> dict:
    return {
        "address": address,
        "size": size,
        "phase": phase,
        "frames": frames,
        "index": index,
        "freed": None,
    }


def live_at(tl: Timeline, index: int) -> list[dict]:
    """The blocks alive right after event ``index`` of ``tl``: {"address", "size" (requested
    bytes), "phase" (where it was allocated; "before" for a block from ahead of the window),
    "frames", "index" (its allocation event; None before the window), "freed" (the event that
    frees it; None: still alive when the snapshot was taken)}. Blocks from before the window are
    those freed later in it and those alive throughout (``tl.persistent``)."""
    live: dict[int, dict] = {}  # address -> block, for the blocks alive after event `index`
    current: dict[int, dict | None] = {}  # the window's allocations not yet freed
    before = []
    for i, e in enumerate(tl.events):
        addr = e["addr"]
        if e["action"] == ALLOC:
            block = _block(addr, e["size"], tl.phase_at(i), e.get("frames", []), i)
            current[addr] = block if i <= index else None
            if i <= index:
                live[addr] = block
        elif addr in current:
            block = current.pop(addr)
            if block is not None and i > index:
                block["freed"] = i
            elif i <= index:
                live.pop(addr, None)
        elif i > index:
            before.append(_block(addr, e["size"], "before", e.get("frames", []), None))
            before[-1]["freed"] = i
    kept = [
        _block(
            b["address"], b.get("requested_size", b["size"]), "before", b.get("frames", []), None
        )
        for b in tl.persistent
    ]
    return [*live.values(), *before, *kept]


def attribute(
    blocks: list[dict],
    rules: list[tuple[str, Callable[[dict], bool]]],
    default: Callable[[dict], str] = lambda b: f"other (allocated in {b['phase']})",
) -> dict[str, int]:
    """Bytes of ``blocks`` (from :func:`live_at`) per category, largest first: each block goes to
    the first rule ``(category, test(block) -> bool)`` it passes, else to ``default(block)``."""
    out: dict[str, int] = {}
    for b in blocks:
        category = next((name for name, test in rules if test(b)), None) or default(b)
        out[category] = out.get(category, 0) + b["size"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def where(frames: list[dict], within: str = "helpers/core/") -> str:
    """The innermost frame of ``frames`` in files whose path contains ``within`` (default: the
    course's model and training step, not the code that measures them), as
    "model.py:138 forward"; "" if none. Reads both CUDA frames ({"filename", "line", "name"}) and
    the CPU trace's ({"name": "helpers/core/model.py(138): forward"})."""
    for f in frames:
        text = f"{f.get('filename', '')}:{f.get('line', 0)} {f.get('name', '')}"
        if within in text:
            if f.get("filename", "none") != "none":
                return f"{Path(f['filename']).name}:{f['line']} {f['name']}"
            path, _, func = f["name"].partition(": ")
            return f"{Path(path.split('(')[0]).name}:{path.split('(')[-1].rstrip(')')} {func}"
    return ""


def segment_summary(snapshot: dict, device_index: int | None = None) -> dict[str, float]:
    """The allocator's segments in numbers (bytes; ``device_index`` None = every device):
    {"segments", "reserved" (sum of segment sizes), "allocated" (blocks in use),
    "pending_free" (freed, waiting for a stream), "free" (inactive blocks), "largest_free" (the
    largest inactive block: the largest request served without a new cudaMalloc),
    "fragmentation" (1 - largest_free / free: 0 when all free memory is one block, near 1 when it
    is scattered in many small pieces; 0.0 when nothing is free)}."""
    segs = [
        s
        for s in snapshot.get("segments", [])
        if device_index is None or s.get("device", device_index) == device_index
    ]
    sizes = {"active_allocated": [], "active_pending_free": [], "inactive": []}
    for s in segs:
        for b in s["blocks"]:
            sizes.setdefault(b["state"], []).append(b["size"])
    free = sum(sizes["inactive"])
    largest = max(sizes["inactive"], default=0)
    return {
        "segments": len(segs),
        "reserved": sum(s["total_size"] for s in segs),
        "allocated": sum(sizes["active_allocated"]),
        "pending_free": sum(sizes["active_pending_free"]),
        "free": free,
        "largest_free": largest,
        "fragmentation": 1 - largest / free if free else 0.0,
    }


# --------------------------------------------------------------------------------------------
# 3. Rendering
# --------------------------------------------------------------------------------------------


def write_viewer(snapshot: dict, folder: str | Path, name: str = "step") -> dict[str, Path]:
    """Write ``name``.pickle (what ``torch.cuda.memory._dump_snapshot`` writes: drag it onto
    https://pytorch.org/memory_viz) and ``name``.html (PyTorch's
    ``torch.cuda._memory_viz.trace_plot``: the same viewer with the snapshot inside; it loads the
    viewer's JavaScript from cdn.jsdelivr.net, so it needs the internet when opened) into
    ``folder``. Returns {"pickle": path, "html": path}."""
    from torch.cuda import _memory_viz

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"pickle": folder / f"{name}.pickle", "html": folder / f"{name}.html"}
    paths["pickle"].write_bytes(pickle.dumps(snapshot))
    paths["html"].write_text(_memory_viz.trace_plot(snapshot))
    return paths


def segments_text(snapshot: dict) -> str:
    """PyTorch's own text picture of the segments (``torch.cuda._memory_viz.segsum``): one line
    per segment of 20 MiB or more, each 20 MiB page a character (a letter: one block fills it,
    ' ': free, a digit: partly full), then the totals. Needs a CUDA snapshot (a CPU trace has no
    real segments)."""
    from torch.cuda import _memory_viz

    return _memory_viz.segsum(snapshot)
