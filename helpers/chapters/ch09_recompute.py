"""What to recompute (chapter 09): whole blocks, every k-th block, or a selective policy, read from
:func:`helpers.chapters.ch09_tradeoffs.checkpointing_sweep` rows; and the seed article's
checkpointing claim set against the committed H200 measurement.

The mechanism is the model's: ``RunConfig.checkpoint_every`` picks the blocks,
``RunConfig.checkpoint_policy`` what each keeps (``"block"``: its input only; ``"selective"``: also
its matmul and attention outputs, :mod:`helpers.core.recompute`). This module only turns the
measured rows into the chapter's table and sentences.
"""

from __future__ import annotations

from helpers.chapters.ch09_tradeoffs import setting_label
from helpers.measure import memory, results

# The settings the chapter compares at one B and T: off, every 2nd block, every block (whole
# blocks recomputed), every block with the selective policy.
SETTINGS: list = [0, 2, 1, (1, "selective")]

# Seed article 004, section 4.3 (activation checkpointing), its claim in English: "this adds about
# 30% compute overhead, but markedly reduces memory use, usually letting you use a 2x larger batch
# or model".
ARTICLE_OVERHEAD = 0.30
ARTICLE_BATCH_FACTOR = 2.0


def _memory(row: dict) -> int:
    """The memory figure a comparison uses: the measured peak on CUDA, else the held bytes."""
    return row["peak_bytes"] if row["peak_bytes"] is not None else row["held_bytes"]


def table(rows: list[dict]) -> str:
    """A Markdown table of sweep rows: setting, blocks checkpointed, ms/step, step time against
    "off" (%), peak memory (GiB, CUDA only), bytes held after forward. The first row must be "off".
    """
    off = rows[0]
    if off["checkpoint_every"] != 0:
        raise ValueError("table needs the 'off' row (checkpoint_every=0) first")
    body = [
        [
            setting_label(r),
            r["checkpointed_blocks"],
            f"{r['ms']:.1f}",
            f"{100 * (r['ms'] / off['ms'] - 1):+.0f}%",
            memory.format_bytes(r["peak_bytes"]),
            memory.format_bytes(r["held_bytes"]),
        ]
        for r in rows
    ]
    header = ["checkpointing", "blocks", "ms/step", "vs off", "peak memory", "held after forward"]
    return results.markdown_table(header, body, "lrrrrr")


def conclusion(rows: list[dict]) -> str:
    """One sentence, on three lines, computed from sweep rows holding "off", "every block" and
    "every block, selective": what the selective policy saves and costs next to whole-block
    recomputation.

    Memory is the measured peak on CUDA and the held bytes elsewhere (the sentence says which);
    time is the median step. Raises ValueError if one of the three rows is missing.
    """
    by = {setting_label(r): r for r in rows}
    missing = {"off", "every block", "every block, selective"} - set(by)
    if missing:
        raise ValueError(f"conclusion needs the rows {sorted(missing)}")
    off, full, sel = by["off"], by["every block"], by["every block, selective"]
    what = "peak memory" if off["peak_bytes"] is not None else "memory held after forward"
    saved_full = _memory(off) - _memory(full)
    saved_sel = _memory(off) - _memory(sel)
    share = f"{100 * saved_sel / saved_full:.0f}%" if saved_full > 0 else "-"
    return (
        f"Selective recomputation, every block: {what} "
        f"{memory.format_bytes(_memory(sel))} against {memory.format_bytes(_memory(off))} off,\n"
        f"{share} of the {memory.format_bytes(saved_full)} that recomputing whole blocks saves;\n"
        f"step {100 * (sel['ms'] / off['ms'] - 1):+.0f}% against off "
        f"(whole blocks: {100 * (full['ms'] / off['ms'] - 1):+.0f}%)."
    )


def article_check(ref: dict) -> str:
    """ "The article says ...; measured here ..." for seed article 004's checkpointing claim
    (:data:`ARTICLE_OVERHEAD`, :data:`ARTICLE_BATCH_FACTOR`), from the committed checkpointing JSON
    (``results/h200-checkpointing.json``): the step-time increase of checkpointing every block and
    the ratio of the largest B under the JSON's memory limit, every block against off, with the
    JSON's GPU and date. Raises KeyError if the JSON lacks the "off" or "every block" rows."""
    rows = {setting_label(r): r for r in ref["rows"]}
    best = {setting_label(r): r["max_batch_size"] for r in ref["max_batch"] or []}
    off, full = rows["off"], rows["every block"]
    overhead = full["ms"] / off["ms"] - 1
    shape = ref["config"]["run"]
    measured = (
        f"**measured here** on the course's {ref['device']} ({ref['date']}, "
        f"B={shape['batch_size']}, T={shape['seq_len']}): checkpointing every block made the step "
        f"{100 * overhead:.0f}% slower ({off['ms']:.1f} to {full['ms']:.1f} ms)"
    )
    if "off" in best and "every block" in best:
        b0, b1 = best["off"], best["every block"]
        measured += (
            f" and raised the largest B under {memory.format_bytes(ref['limit_bytes'])} from "
            f"{b0} to {b1} ({b1 / b0:.2f}x)"
        )
    return (
        f"**The article says** checkpointing costs about {100 * ARTICLE_OVERHEAD:.0f}% more "
        f"compute and usually allows a {ARTICLE_BATCH_FACTOR:g}x larger batch; {measured}."
    )
