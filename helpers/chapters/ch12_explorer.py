"""Chapter 12's explorer: tick optimisations and read which measured ladder row they are.

Works on the results dict of :func:`helpers.ladder.run_ladder` (or a committed
``results/*-ladder-*.json``): the ladder adds switches in order, so only a prefix of its rungs is a
measured configuration. :func:`explorer` is the ipywidgets view; :func:`selection_markdown` draws
one of its states without widgets, for a static view of the notebook.
"""

from __future__ import annotations

from collections.abc import Sequence

from helpers.measure import memory
from helpers.measure.results import markdown_table as pipe_table

# --------------------------------------------------------------------------------------------
# The explorer: which measured row does a set of switches correspond to?
# --------------------------------------------------------------------------------------------


def _row_line(row: dict) -> str:
    mfu = f"{100 * row['mfu']:.1f}%" if row.get("mfu") is not None else "not reported"
    return (
        f"{row['ms_per_step']:.1f} ms/step, {row['tokens_per_s']:,.0f} tokens/s, "
        f"{row['speedup']:.2f}x over the first rung, MFU {mfu}, "
        f"peak memory {memory.format_bytes(row.get('peak_mem_bytes'))}"
    )


def _selection(results: dict, enabled: Sequence[bool]) -> tuple[str, str | None, str]:
    """(header, the names of the measured rungs switched on or None, the answer) for
    :func:`describe_selection` and :func:`selection_markdown`."""
    rows = results["rungs"]
    if len(enabled) != len(rows) - 1:
        raise ValueError(
            f"need {len(rows) - 1} switches (one per rung after {rows[0]['name']!r}), "
            f"got {len(enabled)}"
        )
    on = [True, *enabled]
    header = (
        f"{results['device']}, B={results['config']['batch_size']}, "
        f"T={results['config']['seq_len']}, {results['date']}"
    )
    bad = [r["name"] for r, o in zip(rows, on, strict=True) if o and r["status"] == "skipped"]
    if bad:
        why = "; ".join(f"{r['name']}: {r['reason']}" for r in rows if r["name"] in bad)
        return header, None, f"not measured: {', '.join(bad)} could not run on this device ({why})"
    k = max(i for i, o in enumerate(on) if o)
    gaps = [
        r["name"]
        for r, o in zip(rows[:k], on[:k], strict=True)
        if not o and r["status"] != "skipped"
    ]
    if gaps:
        return (
            header,
            None,
            f"not measured: the ladder adds switches in order, so {rows[k]['name']!r} "
            f"was only measured together with {', '.join(repr(g) for g in gaps)}. To time this "
            "combination, build it with train.RunConfig and time it with timing.measure.",
        )
    row = rows[k]
    if row["status"] != "measured":
        return header, None, f"{row['name']}: {row['status']} ({row['reason']})"
    names = " ".join(
        r["name"]
        for r, o in zip(rows[: k + 1], on[: k + 1], strict=True)
        if o and r["status"] == "measured"
    )
    return header, names, _row_line(row)


def describe_selection(results: dict, enabled: Sequence[bool]) -> str:
    """What the ladder measured for the optimisations switched on in ``enabled``.

    ``enabled`` has one bool per rung after the first (the first rung is the baseline, always on).
    The ladder measured cumulative configurations only: rungs 1..k on, the rest off (skipped rungs
    must stay off: they never ran). Any other selection is explained, not guessed.

    Raises:
        ValueError: if ``enabled`` does not have one entry per optimisation rung.
    """
    header, names, answer = _selection(results, enabled)
    return f"{header}\n{answer}" if names is None else f"{header}\n{names}\n  -> {answer}"


def default_selection(results: dict) -> list[bool]:
    """What :func:`explorer` ticks when it opens on ``results``: every rung after the first that
    was measured (one bool per rung after the first)."""
    return [r["status"] == "measured" for r in results["rungs"][1:]]


def selection_markdown(results: dict, enabled: Sequence[bool]) -> str:
    """One state of :func:`explorer`, drawn without widgets, as Markdown: the results it reads, a
    table of its tick boxes (one row per rung: ticked or not, and the ladder's ms/step and
    speed-up up to that rung, or "skipped"; the first rung, which the widget has no box for,
    marked "base")
    and the answer of :func:`describe_selection`. For a static view (GitHub, nbconvert, a notebook
    opened without its kernel), where the widget itself shows nothing.

    Raises:
        ValueError: if ``enabled`` does not have one entry per optimisation rung.
    """
    header, names, answer = _selection(results, enabled)
    rows = results["rungs"]

    def measured(r: dict) -> list[str]:
        if r["status"] != "measured":
            return [r["status"], "-"]
        return [f"{r['ms_per_step']:.1f}", f"{r['speedup']:.2f}x"]

    # The first rung is the base every selection starts from: the widget has no box for it.
    ticks = [["base", f"`{rows[0]['name']}`", *measured(rows[0])]] + [
        ["\u2611" if o else "\u2610", f"`{r['name']}`", *measured(r)]
        for r, o in zip(rows[1:], enabled, strict=True)
    ]
    head = ["ticked", "rung", "ms/step (ladder, up to this rung)", "speed-up"]
    table = pipe_table(head, ticks, "llrr")
    said = f"**measured:** {answer}" if names is not None else answer
    return f"**{header}**\n\n{table}\n\n{said}"


def explorer(sources: dict[str, dict]):
    """An ipywidgets explorer: pick a results source, tick optimisations, read the measured row.

    ``sources`` maps a label (e.g. "this device", "H200 B=16 (committed)") to a ladder results dict.
    It opens on the first source with :func:`default_selection` ticked; a static view shows no
    widget, so show that state with :func:`selection_markdown` too.
    Returns the widget (display it); the text also goes to its Output area.
    """
    import ipywidgets as widgets

    pick = widgets.Dropdown(options=list(sources), description="results")
    boxes = widgets.VBox()
    out = widgets.Output()

    def show(*_):
        res = sources[pick.value]
        out.clear_output()
        with out:
            print(describe_selection(res, [b.value for b in boxes.children]))

    def rebuild(*_):
        res = sources[pick.value]
        new = []
        for r, ticked in zip(res["rungs"][1:], default_selection(res), strict=True):
            b = widgets.Checkbox(value=ticked, description=r["name"], indent=False)
            b.observe(show, names="value")
            new.append(b)
        boxes.children = tuple(new)
        show()

    pick.observe(rebuild, names="value")
    rebuild()
    return widgets.VBox([pick, boxes, out])
