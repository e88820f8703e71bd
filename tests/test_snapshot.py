"""helpers.measure.snapshot: reading a memory snapshot, on fake snapshots built to PyTorch's format
(the docstring of torch.cuda.memory._snapshot), and recording one on the CPU."""

import pytest
import torch

from helpers.measure import snapshot as sn

MiB = 2**20


class FakeAllocator:
    """A caching allocator's trace and final state in PyTorch's snapshot format: one segment, bump
    allocation (no reuse), blocks rounded up to 512 bytes as the CUDA allocator rounds them."""

    def __init__(self, base: int = 0x7F0000000000, total: int = 64 * MiB, device: int = 0):
        self.base, self.total, self.device, self.next = base, total, device, base
        self.trace: list[dict] = [{"action": "segment_alloc", "addr": base, "size": total}]
        self.blocks: dict[int, dict] = {}  # address -> block

    def alloc(self, size: int, where: str = "model.py") -> int:
        addr, rounded = self.next, -(-size // 512) * 512
        self.next += rounded
        frames = [{"filename": f"/course/helpers/core/{where}", "line": 7, "name": "forward"}]
        self.trace.append({"action": "alloc", "addr": addr, "size": size, "frames": frames})
        self.blocks[addr] = {
            "size": rounded,
            "requested_size": size,
            "state": "active_allocated",
            "frames": frames,
        }
        return addr

    def free(self, addr: int, pending: bool = False) -> None:
        size = self.blocks[addr]["requested_size"]
        self.trace.append({"action": "free_requested", "addr": addr, "size": size})
        if pending:
            self.blocks[addr]["state"] = "active_pending_free"
        else:
            self.trace.append({"action": "free_completed", "addr": addr, "size": size})
            self.blocks[addr]["state"] = "inactive"

    def snapshot(self) -> dict:
        blocks = [dict(self.blocks[a], address=a) for a in sorted(self.blocks)]
        rest = self.base + self.total - self.next
        blocks.append({"size": rest, "requested_size": 0, "state": "inactive", "frames": []})
        segment = {
            "device": self.device,
            "address": self.base,
            "total_size": self.total,
            "stream": 0,
            "segment_type": "large",
            "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
            "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
            "blocks": blocks,
        }
        return {"segments": [segment], "device_traces": [list(self.trace)]}


def _step(markers_at=True):
    """A fake step: weights before the window, a forward that keeps two activations, a backward
    whose peak holds a gradient and both activations, then frees."""
    fa = FakeAllocator()
    weights = fa.alloc(4 * MiB)
    old = fa.alloc(MiB)  # from an earlier step, freed inside the window
    sizes = {}
    if markers_at:
        sizes[sn.MARKER_BASE] = "forward"
        fa.free(fa.alloc(sn.MARKER_BASE))
    act1, act2 = fa.alloc(2 * MiB), fa.alloc(3 * MiB)
    fa.free(old)
    if markers_at:
        sizes[sn.MARKER_BASE + 2] = "backward"
        fa.free(fa.alloc(sn.MARKER_BASE + 2))
    grad = fa.alloc(4 * MiB, "train.py")
    fa.free(act2)
    fa.free(act1, pending=True)
    return fa, sizes, dict(weights=weights, grad=grad, act1=act1, act2=act2)


def test_timeline_counts_allocs_and_free_requests_from_the_final_state():
    fa, markers, _ = _step()
    tl = sn.timeline(fa.snapshot(), 0, markers)
    assert tl.baseline == 5 * MiB and tl.consistent  # weights + the old block, before the window
    assert tl.peak_bytes == 4 * MiB + 2 * MiB + 3 * MiB + 4 * MiB  # old freed before the grad
    assert tl.phase_at(tl.peak_index) == "backward"
    assert tl.bytes[-1] == 8 * MiB  # weights + grad: the pending block no longer counts
    assert [name for _, name in tl.phases] == ["forward", "backward"]
    peaks = tl.phase_peaks()
    assert peaks["forward"]["start"] == 5 * MiB and peaks["forward"]["peak"] == 10 * MiB
    assert peaks["backward"]["peak"] == tl.peak_bytes


def test_without_markers_the_window_is_the_whole_trace():
    fa, _, _ = _step(markers_at=False)
    tl = sn.timeline(fa.snapshot(), 0)
    assert tl.baseline == 0 and tl.phases == [] and tl.phase_at(3) == "before" and tl.consistent
    assert tl.peak_bytes == 13 * MiB


def test_a_trace_that_lost_its_start_is_reported_inconsistent():
    fa, markers, _ = _step()
    snap = fa.snapshot()
    trace = snap["device_traces"][0]
    lost = next(i for i, e in enumerate(trace) if e["action"] == "free_requested" and i > 8)
    snap["device_traces"][0] = trace[:lost] + trace[lost + 1 :]  # a free the trace lost
    assert not sn.timeline(snap, 0, markers).consistent


def test_live_at_the_peak_names_every_block_and_when_it_is_freed():
    fa, markers, addr = _step()
    tl = sn.timeline(fa.snapshot(), 0, markers)
    blocks = {b["address"]: b for b in sn.live_at(tl, tl.peak_index)}
    assert sum(b["size"] for b in blocks.values()) == tl.peak_bytes
    assert set(blocks) == {addr["weights"], addr["act1"], addr["act2"], addr["grad"]}
    assert blocks[addr["weights"]]["phase"] == "before" and blocks[addr["weights"]]["freed"] is None
    assert blocks[addr["act2"]]["phase"] == "forward" and blocks[addr["act2"]]["freed"] is not None
    assert blocks[addr["grad"]]["phase"] == "backward" and blocks[addr["grad"]]["freed"] is None
    early = {b["size"] for b in sn.live_at(tl, 0)}  # the old block is alive before its free
    assert early == {4 * MiB, MiB, sn.MARKER_BASE}


def test_attribute_takes_the_first_rule_and_falls_back_to_the_phase():
    fa, markers, addr = _step()
    tl = sn.timeline(fa.snapshot(), 0, markers)
    rules = [
        ("weights", lambda b: b["address"] == addr["weights"]),
        ("gradient", lambda b: b["address"] == addr["grad"] and b["freed"] is None),
    ]
    parts = sn.attribute(sn.live_at(tl, tl.peak_index), rules)
    assert parts == {
        "other (allocated in forward)": 5 * MiB,
        "weights": 4 * MiB,
        "gradient": 4 * MiB,
    }
    assert list(parts)[0] == "other (allocated in forward)"  # largest first


def test_in_place_updates_are_not_allocations_in_the_cpu_trace():
    a, b = 0x1000, 0x2000
    trace = [
        {"action": "alloc", "addr": a, "size": 64},
        {"action": "free_requested", "addr": a, "size": 64},
        {"action": "free_completed", "addr": a, "size": 64},
        {"action": "alloc", "addr": a, "size": 64},  # a new version of the same tensor
        {"action": "free_requested", "addr": a, "size": 64},
        {"action": "free_completed", "addr": a, "size": 64},
        {"action": "alloc", "addr": b, "size": 64},  # a real new tensor
    ]
    kept = sn._drop_version_bumps(trace)
    assert [(e["action"], e["addr"]) for e in kept] == [
        ("alloc", a),
        ("free_requested", a),
        ("free_completed", a),
        ("alloc", b),
    ]


def test_where_reads_cuda_and_cpu_frames_and_skips_the_measuring_harness():
    cuda = [
        {"filename": "/x/torch/nn/functional.py", "line": 3, "name": "linear"},
        {"filename": "/c/helpers/measure/profiler.py", "line": 9, "name": "step_with_ranges"},
        {"filename": "/c/helpers/core/model.py", "line": 138, "name": "forward"},
    ]
    assert sn.where(cuda) == "model.py:138 forward"
    cpu = [{"filename": "none", "line": 0, "name": "helpers/core/model.py(363): _lm_head"}]
    assert sn.where(cpu) == "model.py:363 _lm_head"
    assert sn.where([]) == "" and sn.where(cuda[:2]) == ""


def test_segment_summary_counts_free_blocks_and_how_scattered_they_are():
    fa, markers, _ = _step()
    summary = sn.segment_summary(fa.snapshot())
    assert summary["reserved"] == 64 * MiB and summary["segments"] == 1
    assert summary["allocated"] == 8 * MiB and summary["pending_free"] == 2 * MiB
    assert summary["free"] == 64 * MiB - 10 * MiB
    free_blocks = [MiB, 3 * MiB, 512, 512, 64 * MiB - fa.next + fa.base]  # markers are rounded
    assert summary["largest_free"] == max(free_blocks)
    assert summary["fragmentation"] == pytest.approx(1 - max(free_blocks) / summary["free"])
    full = {
        "segments": [
            {
                "address": 0,
                "total_size": 512,
                "blocks": [{"size": 512, "requested_size": 512, "state": "active_allocated"}],
            }
        ]
    }
    assert sn.segment_summary(full)["fragmentation"] == 0.0


def test_points_keep_the_peak_for_a_small_plot():
    fa, markers, _ = _step()
    tl = sn.timeline(fa.snapshot(), 0, markers)
    pts = sn.Timeline.points(tl, n=3)
    assert [tl.peak_index, tl.peak_bytes] in pts and len(pts) <= len(tl.bytes)
    start, stop = tl.window("backward")
    assert tl.phase_at(start) == "backward" and stop == len(tl.bytes)
    with pytest.raises(KeyError, match="no phase"):
        tl.window("optimizer")


def test_pytorchs_own_tools_read_the_fake_snapshot(tmp_path):
    """The fakes follow PyTorch's format: its segsum and trace_plot accept them."""
    fa, _, _ = _step()
    snap = fa.snapshot()
    text = sn.segments_text(snap)
    assert "total_reserved: 64.0MiB" in text and "segments: 1" in text
    paths = sn.write_viewer(snap, tmp_path, "fake")
    assert paths["html"].read_text().count("MemoryViz.js") == 1 and paths["pickle"].stat().st_size


def test_record_on_a_cpu_traces_the_marked_phases():
    markers = sn.Markers("cpu")

    def work():
        with markers("forward"):
            a = torch.ones(1000, 100)
            b = a * 2
        with markers("backward"):
            c = (b + 1).sum()
        return c

    cap = sn.record(work, "cpu", markers)
    assert cap.source.startswith("torch.profiler") and cap.max_allocated is None
    tl = sn.timeline(cap.snapshot, cap.device_index, cap.markers)
    assert [n for _, n in tl.phases] == ["forward", "backward", "after"]
    assert tl.phase_peaks()["forward"]["peak"] - tl.baseline >= 2 * 400_000  # a and b
    assert float(cap.result) == 300_000.0


def test_record_refuses_a_device_it_cannot_trace():
    with pytest.raises(ValueError, match="CUDA or a CPU"):
        sn.record(lambda: None, "meta")
