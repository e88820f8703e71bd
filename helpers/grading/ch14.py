"""Graded checks of chapter 14 (GPU memory in depth), listed in :mod:`helpers.grading`.

1. ``peak_of_trace(events, baseline, phase_starts) -> (phase, peak_bytes)``: from an allocator
   trace in PyTorch's snapshot format (``torch.cuda.memory._snapshot()["device_traces"][0]``),
   the bytes allocated at their largest and the phase that holds that moment.
2. ``fragmentation_report(segments) -> (free, largest_free, fragmentation)``: from a snapshot's
   segments, the bytes of free blocks, the largest free block and 1 - largest_free / free.

The traces and segments are small fakes in PyTorch's format; the answers come from the rules the
chapter states.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from helpers.grading.common import as_number, passed, reread

SECTIONS = {
    "ch14_trace_peak": "chapter 14, section 2 (A memory snapshot of one step)",
    "ch14_fragmentation": "chapter 14, section 6 (Fragmentation, made to happen)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


# --------------------------------------------------------------------------------------------
# ch14_trace_peak
# --------------------------------------------------------------------------------------------


def _e(action: str, addr: int, size: int) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": []}


def _trace_cases() -> list[tuple[list[dict], int, list[tuple[int, str]]]]:
    """(events, baseline bytes, phase starts): a forward that keeps activations, a backward whose
    peak holds a gradient while a block waits for another stream (freed, not yet completed), new
    segments reserved along the way, and an optimizer step; then a trace whose peak is in the
    forward, and one that starts with memory already allocated."""
    MB = 10**6
    step = [
        _e("segment_alloc", 0x1000, 40 * MB),  # 0: forward starts; memory reserved, not allocated
        _e("alloc", 0x1000, 6 * MB),  # 1
        _e("alloc", 0x2000, 8 * MB),  # 2
        _e("free_requested", 0x2000, 8 * MB),  # 3: backward starts; freed, a stream still reads it
        _e("alloc", 0x3000, 9 * MB),  # 4
        _e("free_completed", 0x2000, 8 * MB),  # 5
        _e("alloc", 0x4000, 2 * MB),  # 6
        _e("free_requested", 0x3000, 9 * MB),  # 7
        _e("free_completed", 0x3000, 9 * MB),  # 8
        _e("segment_alloc", 0x9000, 60 * MB),  # 9: optimizer starts
        _e("alloc", 0x5000, 3 * MB),  # 10
        _e("free_requested", 0x5000, 3 * MB),  # 11
        _e("free_completed", 0x5000, 3 * MB),  # 12
        _e("segment_free", 0x9000, 60 * MB),  # 13
    ]
    forward = [
        _e("alloc", 0x1000, 5 * MB),  # 0: forward
        _e("alloc", 0x2000, 5 * MB),  # 1
        _e("free_requested", 0x1000, 5 * MB),  # 2: backward
        _e("free_completed", 0x1000, 5 * MB),  # 3
        _e("alloc", 0x3000, 4 * MB),  # 4
        _e("free_requested", 0x2000, 5 * MB),  # 5
        _e("free_completed", 0x2000, 5 * MB),  # 6
        _e("segment_alloc", 0x8000, 50 * MB),  # 7: optimizer
        _e("alloc", 0x4000, MB),  # 8
    ]
    phases = [(0, "forward"), (3, "backward"), (9, "optimizer")]
    return [
        (step, 0, phases),
        (forward, 7 * MB, [(0, "forward"), (2, "backward"), (7, "optimizer")]),
        (step, 500 * MB, phases),
    ]


def _trace_peak(
    events: list[dict],
    baseline: int,
    phase_starts: list[tuple[int, str]],
    adds: tuple[str, ...] = ("alloc",),
    subtracts: tuple[str, ...] = ("free_requested",),
) -> tuple[str, int, int]:
    """(phase, peak bytes, final bytes) under the given counting rules (the right one by
    default: alloc adds, free_requested takes away)."""
    now, best, where = baseline, baseline, -1
    for i, e in enumerate(events):
        now += e["size"] if e["action"] in adds else -e["size"] if e["action"] in subtracts else 0
        if now > best:
            best, where = now, i
    phase = next((name for start, name in reversed(phase_starts) if start <= where), "before")
    return phase, best, now


def check_trace_peak(fn: Callable[..., Any]) -> None:
    """Check ``peak_of_trace(events, baseline, phase_starts) -> (phase, peak_bytes)`` on three
    fake traces.

    Raises:
        AssertionError: a one-line message with a hint.
    """
    gid = "ch14_trace_peak"
    hint = _reread(gid)
    for events, baseline, phases in _trace_cases():
        call = f"peak_of_trace(<{len(events)} events>, baseline={baseline:,}, ...)"
        got = fn([dict(e) for e in events], baseline, list(phases))
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise AssertionError(f"{call} returned {got!r}: return (phase, peak_bytes). {hint}")
        phase, peak = got[0], as_number(got[1], call, hint)
        want_phase, want, final = _trace_peak(events, baseline, phases)
        if (phase, peak) == (want_phase, want):
            continue
        mistakes = [
            (
                _trace_peak(
                    events, baseline, phases, subtracts=("free_requested", "free_completed")
                ),
                "each free is two entries (free_requested, then free_completed): subtract it once, "
                "at free_requested.",
            ),
            (
                _trace_peak(events, baseline, phases, subtracts=("free_completed",)),
                "a block stops counting as allocated at free_requested, even while a stream still "
                "uses it (free_completed comes later).",
            ),
            (
                _trace_peak(
                    events,
                    baseline,
                    phases,
                    ("alloc", "segment_alloc"),
                    ("free_requested", "segment_free"),
                ),
                "segment_alloc and segment_free are the allocator reserving memory from CUDA and "
                "giving it back (reserved memory), not tensors being allocated.",
            ),
            (
                _trace_peak(events, 0, phases),
                "the bytes allocated before the trace (baseline) are part of every value.",
            ),
        ]
        why = next((text for (p, b, _), text in mistakes if peak == b and b != want), None)
        if why is None and peak == final and final != want:
            why = "that is the value after the last event; return the largest one."
        if why is None and peak == want:
            why = (
                f"the size is right but the phase is {phase!r}, not {want_phase!r}: the phase of "
                "event i is the last phase that starts at or before i."
            )
        why = why or f"expected ({want_phase!r}, {want:,})."
        raise AssertionError(f"{call} returned ({phase!r}, {peak:,.0f}): {why} {hint}")
    passed(gid, f"the peak and its phase of {len(_trace_cases())} allocator traces")


def _peak_double_free(events, baseline, phase_starts):
    return _trace_peak(
        events, baseline, phase_starts, subtracts=("free_requested", "free_completed")
    )[:2]


def _peak_counts_segments(events, baseline, phase_starts):
    adds, subs = ("alloc", "segment_alloc"), ("free_requested", "segment_free")
    return _trace_peak(events, baseline, phase_starts, adds, subs)[:2]


def _peak_without_baseline(events, baseline, phase_starts):
    return _trace_peak(events, 0, phase_starts)[:2]


def _peak_at_free_completed(events, baseline, phase_starts):
    return _trace_peak(events, baseline, phase_starts, subtracts=("free_completed",))[:2]


def _peak_final_value(events, baseline, phase_starts):
    phase, _, final = _trace_peak(events, baseline, phase_starts)
    return phase, final


def _peak_phase_of_the_next_start(events, baseline, phase_starts):
    phase, peak, _ = _trace_peak(events, baseline, phase_starts)
    names = [name for _, name in phase_starts]
    return names[min(names.index(phase) + 1, len(names) - 1)], peak


# --------------------------------------------------------------------------------------------
# ch14_fragmentation
# --------------------------------------------------------------------------------------------


def _b(state: str, size: int, requested: int = 0) -> dict:
    return {"state": state, "size": size, "requested_size": requested or size, "frames": []}


def _segment(address: int, blocks: list[dict]) -> dict:
    total = sum(b["size"] for b in blocks)
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {
        "device": 0,
        "address": address,
        "total_size": total,
        "stream": 0,
        "segment_type": "large",
        "allocated_size": allocated,
        "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
        "blocks": blocks,
    }


def _fragmentation_cases() -> list[list[dict]]:
    MiB = 2**20
    A, P, F = "active_allocated", "active_pending_free", "inactive"
    scattered = [
        _segment(
            0x10000000,
            [
                _b(A, 8 * MiB),
                _b(F, 6 * MiB, 512),
                _b(A, 8 * MiB),
                _b(F, 6 * MiB, 1024),
                _b(P, 20 * MiB),
            ],
        ),
        _segment(
            0x40000000,
            [_b(F, 4 * MiB, 512), _b(A, 2 * MiB), _b(F, 4 * MiB, 512), _b(F, 2 * MiB, 512)],
        ),
    ]
    one_gap = [_segment(0x10000000, [_b(A, 2 * MiB), _b(F, 30 * MiB, 512)])]
    full = [_segment(0x10000000, [_b(A, 2 * MiB), _b(P, 2 * MiB)])]
    return [scattered, one_gap, full]


def _fragmentation(
    segments: list[dict],
    free_states=("inactive",),
    per_segment=False,
    size_key="size",
    inverted=False,
) -> tuple[float, float, float]:
    free_blocks = [b[size_key] for s in segments for b in s["blocks"] if b["state"] in free_states]
    if per_segment:
        largest = max(
            (sum(b[size_key] for b in s["blocks"] if b["state"] in free_states) for s in segments),
            default=0,
        )
    else:
        largest = max(free_blocks, default=0)
    free = sum(free_blocks)
    if not free:
        return 0, 0, 0.0
    return free, largest, (largest / free if inverted else 1 - largest / free)


def check_fragmentation(fn: Callable[[list[dict]], Any]) -> None:
    """Check ``fragmentation_report(segments) -> (free, largest_free, fragmentation)`` on three
    fake snapshots' segments (one with free memory scattered over two segments and a block
    waiting for a stream, one with a single gap, one with nothing free).

    Raises:
        AssertionError: a one-line message with a hint.
    """
    gid = "ch14_fragmentation"
    hint = _reread(gid)
    for segments in _fragmentation_cases():
        call = f"fragmentation_report(<{len(segments)} segments>)"
        try:
            got = fn([{**s, "blocks": [dict(b) for b in s["blocks"]]} for s in segments])
        except ZeroDivisionError:
            raise AssertionError(
                f"{call} divided by zero: when no block is free, the fragmentation is 0.0. {hint}"
            ) from None
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            raise AssertionError(
                f"{call} returned {got!r}: return (free, largest_free, fragmentation). {hint}"
            )
        free, largest, frag = (as_number(v, call, hint) for v in got)
        want = _fragmentation(segments)
        if abs(free - want[0]) < 1 and abs(largest - want[1]) < 1 and abs(frag - want[2]) < 1e-6:
            continue
        mistakes = [
            (
                _fragmentation(segments, ("inactive", "active_pending_free")),
                "a block in state active_pending_free is freed but still read by a stream: it is "
                "not free for a new tensor yet; count only inactive blocks.",
            ),
            (
                _fragmentation(segments, size_key="requested_size"),
                "a free block's bytes are its size (requested_size is what its last tensor asked "
                "for, before rounding).",
            ),
            (
                _fragmentation(segments, per_segment=True),
                "largest_free is the largest single free block: one request needs one contiguous "
                "block, and free blocks of one segment lie apart, between live ones.",
            ),
            (
                _fragmentation(segments, inverted=True),
                "fragmentation is 1 - largest_free / free: 0 when all free memory is one block.",
            ),
        ]
        why = next(
            (
                text
                for w, text in mistakes
                if w != want
                and all(
                    abs(a - b) < max(1e-6, 1e-9 * abs(b)) for a, b in zip((free, largest, frag), w)
                )
            ),
            f"expected (free, largest_free, fragmentation) = ({want[0]:,}, {want[1]:,}, "
            f"{want[2]:.4f}).",
        )
        raise AssertionError(
            f"{call} returned ({free:,.0f}, {largest:,.0f}, {frag:.4f}): {why} {hint}"
        )
    passed(
        gid,
        f"free bytes, the largest free block and the fragmentation of "
        f"{len(_fragmentation_cases())} snapshots",
    )


def _frag_counts_pending(segments):
    return _fragmentation(segments, ("inactive", "active_pending_free"))


def _frag_requested_sizes(segments):
    return _fragmentation(segments, size_key="requested_size")


def _frag_largest_segment(segments):
    return _fragmentation(segments, per_segment=True)


def _frag_inverted(segments):
    return _fragmentation(segments, inverted=True)


def _frag_divides_by_zero(segments):
    free = [b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive"]
    return sum(free), max(free, default=0), 1 - max(free, default=0) / sum(free)


CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = {
    "ch14_trace_peak": check_trace_peak,
    "ch14_fragmentation": check_fragmentation,
}

WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch14_trace_peak": [
        _peak_double_free,
        _peak_counts_segments,
        _peak_without_baseline,
        _peak_at_free_completed,
        _peak_final_value,
        _peak_phase_of_the_next_start,
    ],
    "ch14_fragmentation": [
        _frag_counts_pending,
        _frag_requested_sizes,
        _frag_largest_segment,
        _frag_inverted,
        _frag_divides_by_zero,
    ],
}
