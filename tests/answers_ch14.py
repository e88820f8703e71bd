"""Right answers of chapter 14's exercises, written independently of helpers/grading/ch14.py
(tests/test_grading.py loads RIGHT_ANSWERS)."""


def peak_of_trace(events, baseline, phase_starts):
    allocated, peak, at = baseline, baseline, None
    for i, event in enumerate(events):
        if event["action"] == "alloc":
            allocated += event["size"]
        elif event["action"] == "free_requested":
            allocated -= event["size"]
        if allocated > peak:
            peak, at = allocated, i
    phase = "before"
    for start, name in phase_starts:
        if at is not None and start <= at:
            phase = name
    return phase, peak


def fragmentation_report(segments):
    free = [b["size"] for s in segments for b in s["blocks"] if b["state"] == "inactive"]
    if not free:
        return 0, 0, 0.0
    return sum(free), max(free), 1 - max(free) / sum(free)


RIGHT_ANSWERS = {
    "ch14_trace_peak": peak_of_trace,
    "ch14_fragmentation": fragmentation_report,
}
