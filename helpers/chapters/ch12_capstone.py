"""Chapter 12, the capstone: the whole speed-up ladder on this device,
compared, trained and summed up.

Everything here works on the results dict of :func:`helpers.ladder.run_ladder` (or a committed
``results/*-ladder-*.json``), whose rows are read as they are: rung names, counts and switches
come from the rows, never from a list written here. Published figures (the seed articles' A100
and T4 step times, ``results/published-seed-figures.json``) are kept apart from measured ones:
they appear in their own columns, labelled "published".
"""

from __future__ import annotations

import dataclasses
import math

import torch

from helpers import switches

# the explorer lives in its own module; the notebook reads it as capstone.<name>
from helpers.chapters.ch12_explorer import (  # noqa: F401
    default_selection,
    describe_selection,
    explorer,
    selection_markdown,
)
from helpers.core.model import GPT, GPTConfig
from helpers.core.train import RunConfig
from helpers.measure.plots import ladder_panels as ladder_figure  # noqa: F401 (the notebook's name)
from helpers.measure.results import markdown_table as pipe_table

PUBLISHED_FILE = "published-seed-figures.json"

# Fields of a ladder row's "switches" that are not speed switches (the batch shape and AdamW's
# hyper-parameters): equal across one ladder, ignored when looking for what a rung changed.
_NOT_SWITCHES = ("batch_size", "seq_len", "grad_clip", "lr", "weight_decay", "betas", "seed")

# When to use each optimisation: static advice keyed by the switch a rung changes, or by
# (switch, value) where the value matters, read from the switch registry (plus the batch size,
# which is a shape, not a switch). The measured gain next to it comes from the table.
WHEN_TO_USE: dict[str | tuple[str, object], str] = {
    **switches.advice_table(),
    "batch_size": "the largest B that fits (chapter 03) while tokens/s still grows",
}


# --------------------------------------------------------------------------------------------
# Reading ladder rows
# --------------------------------------------------------------------------------------------


def _switches(row: dict) -> dict:
    return {k: v for k, v in row.get("switches", {}).items() if k not in _NOT_SWITCHES}


def rung_changes(results: dict) -> list[dict]:
    """What each rung turns on, derived from the rows' ``switches`` (nothing hard-coded).

    The ladder is cumulative, and a skipped rung's switch is not carried forward, so rung i's
    change is its switches minus those of the last rung before it that was not skipped.
    Returns one dict per row, ``{switch: new value}`` ({} for the first row).
    """
    changes, previous = [], None
    for row in results["rungs"]:
        sw = _switches(row)
        changes.append(
            {} if previous is None else {k: v for k, v in sw.items() if previous.get(k) != v}
        )
        if row["status"] != "skipped":
            previous = sw
    return changes


def measured_rows(results: dict) -> list[dict]:
    """The rows with status "measured", in ladder order."""
    return [r for r in results["rungs"] if r["status"] == "measured"]


def fastest_rung(results: dict) -> dict:
    """The configuration to train: the last measured rung (it carries every switch that runs here).

    Raises:
        ValueError: if no rung was measured.
    """
    rows = measured_rows(results)
    if not rows:
        raise ValueError(
            f"no rung of the ladder on {results.get('device')} was measured: nothing to train"
        )
    return rows[-1]


def run_config_of(row: dict) -> RunConfig:
    """The :class:`RunConfig` a ladder row was measured with (from its ``switches``)."""
    sw = dict(row["switches"])
    if "betas" in sw:
        sw["betas"] = tuple(sw["betas"])  # JSON stores tuples as lists
    return RunConfig(name=row["name"], **sw)


def model_config_of(results: dict) -> GPTConfig:
    """The :class:`GPTConfig` the ladder ran (``results["config"]["model"]``). Results written
    when GPTConfig also held the model's switches name them there too (at their baseline; each
    row carries its own switches): only the shape fields are read."""
    shape = {f.name for f in dataclasses.fields(GPTConfig)}
    return GPTConfig(**{k: v for k, v in results["config"]["model"].items() if k in shape})


def ladder_settings(device: torch.device | str) -> dict:
    """Warm-up and timed steps per rung for this chapter: 3 and 10 on a GPU (GPT-2 124M, ~4 min on
    an H200, the compiles included), 1 and 2 on a CPU (the small config; one warm-up step still
    absorbs the compile)."""
    return (
        dict(warmup=3, iters=10) if torch.device(device).type == "cuda" else dict(warmup=1, iters=2)
    )


# --------------------------------------------------------------------------------------------
# A time budget for training
# --------------------------------------------------------------------------------------------


def steps_for_budget(
    step_ms: float,
    budget_s: float,
    first_step_ms: float | None = None,
    min_steps: int = 1,
    max_steps: int | None = None,
) -> int:
    """How many training steps fit in ``budget_s`` seconds at ``step_ms`` milliseconds per step.

    ``first_step_ms`` (the measured first step: compile, allocator warm-up) is paid once and taken
    out of the budget first. The result is clipped to [min_steps, max_steps].

    Raises:
        ValueError: step_ms <= 0, budget_s <= 0, min_steps < 1 or max_steps < min_steps.
    """
    if not step_ms > 0 or not budget_s > 0:
        raise ValueError(f"need step_ms > 0 and budget_s > 0, got {step_ms} ms and {budget_s} s")
    if min_steps < 1 or (max_steps is not None and max_steps < min_steps):
        raise ValueError(f"need 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
    extra = (
        max(first_step_ms or 0.0, step_ms) - step_ms
    )  # the first step's cost above a normal step
    steps = math.floor((1000.0 * budget_s - extra) / step_ms)
    steps = max(steps, min_steps)
    return steps if max_steps is None else min(steps, max_steps)


def training_budget(device: torch.device | str) -> dict:
    """The chapter's training budget: 100 s, 100..3000 steps on a GPU;
    10 s, 20..40 steps on a CPU."""
    if torch.device(device).type == "cuda":
        return dict(budget_s=100.0, min_steps=100, max_steps=3000)
    return dict(budget_s=10.0, min_steps=20, max_steps=40)


def sample_text(
    model: GPT,
    prompt: str,
    max_new_tokens: int,
    seed: int = 0,
    temperature: float = 0.8,
    top_k: int = 50,
) -> str:
    """Generate ``max_new_tokens`` GPT-2 tokens after ``prompt`` with a seeded generator on the
    model's device and return the decoded text (prompt included). Padded ids are never sampled
    (:meth:`helpers.core.model.GPT.generate` masks them)."""
    from helpers.core import tokenizer

    device = next(model.parameters()).device
    idx = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long, device=device)  # (1, T0)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = model.generate(
        idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=gen
    )  # (1, T0 + n)
    return tokenizer.decode(out[0].tolist())


# --------------------------------------------------------------------------------------------
# The final checklist, derived from a measured table
# --------------------------------------------------------------------------------------------


def when_to_use(switch: str, value: object) -> str:
    """The static advice for turning ``switch`` to ``value`` (see :data:`WHEN_TO_USE`)."""
    if (switch, value) in WHEN_TO_USE:
        return WHEN_TO_USE[(switch, value)]
    if switch in WHEN_TO_USE:
        return WHEN_TO_USE[switch]
    return f"no advice written for switch {switch!r} yet: see the chapter that introduced it"


def checklist(results: dict, noise_floor: float = 0.03, where: str = "here") -> list[dict]:
    """One row per optimisation (every rung after the first): what it changed, its measured gain
    on this device, a verdict, when to use it and, if it did not run, why.

    gain = (ms/step of the last measured rung before it) / (its ms/step): 1.25 means 25% more steps
    per second. A gain within the noise, max(noise_floor, the larger spread_pct of the two rows) is
    called "no clear gain here" (with "slower" when below 1x). ``where`` names the device in the
    verdicts ("here" for this device's run; e.g. "on the H200" for a committed result, so it is
    never read as this device's).
    Returns dicts with keys optimisation, switches, status, gain (float or None), compared_with,
    verdict, when, skipped_reason.
    """
    rows, changes = results["rungs"], rung_changes(results)
    out, previous = [], None
    for i, (row, change) in enumerate(zip(rows, changes, strict=True)):
        if i > 0:
            item = {
                "optimisation": row["name"],
                "switches": change,
                "status": row["status"],
                "gain": None,
                "compared_with": None,
                "verdict": "",
                "skipped_reason": None,
                "when": "; ".join(when_to_use(k, v) for k, v in change.items())
                or when_to_use(row["name"], None),
            }
            if row["status"] != "measured":
                item["skipped_reason"] = row.get("reason")
                item["verdict"] = (
                    f"not run {where}" if row["status"] == "skipped" else f"failed {where}"
                )
            elif previous is None:
                item["verdict"] = "no earlier measured rung to compare with"
            else:
                gain = previous["ms_per_step"] / row["ms_per_step"]
                noise = max(
                    noise_floor,
                    max(previous.get("spread_pct") or 0.0, row.get("spread_pct") or 0.0) / 100,
                )
                item["gain"], item["compared_with"] = gain, previous["name"]
                if gain > 1 + noise:
                    item["verdict"] = f"faster {where}: {gain:.2f}x"
                elif gain < 1 - noise:
                    item["verdict"] = f"slower {where}: {gain:.2f}x"
                else:
                    # inside the spread either way; a slowdown is named as one
                    sign = "slower, " if gain < 1 else ""
                    item["verdict"] = (
                        f"no clear gain {where}: {sign}{gain:.2f}x, inside the "
                        f"{100 * noise:.0f}% spread"
                    )
            out.append(item)
        if row["status"] == "measured":
            previous = row
    return out


def format_checklist(items: list[dict], width: int = 100) -> str:
    """The checklist as text: one block per optimisation
    (name, verdict, when to use it, reason if skipped)."""
    import textwrap

    lines = []
    for n, it in enumerate(items, 1):
        lines.append(f"{f'[{n}]':<4} {it['optimisation']:<22} {it['verdict']}")
        if it["skipped_reason"]:
            lines.append(f"    why not: {it['skipped_reason']}")
        lines += textwrap.wrap(
            f"when: {it['when']}", width, initial_indent="    ", subsequent_indent="          "
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Measured next to published, never in one column
# --------------------------------------------------------------------------------------------


def published_problems(pub: dict) -> list[str]:
    """What is wrong with a published-figures dict (empty list = valid): kind "published", sources
    with file/title/author/url fields, every figure's source known, stages with a label, a
    ``requires`` that is a dict or "last", and positive step times."""
    problems = []
    if pub.get("kind") != "published":
        problems.append("kind must be 'published'")
    sources = pub.get("sources") or {}
    if not sources:
        problems.append("no sources")
    for key, src in sources.items():
        for field in ("file", "title", "author", "url"):
            if field not in src:
                problems.append(
                    f"source {key} lacks the field {field!r} "
                    "(use null when the seed does not give it)"
                )
        for field in ("title", "author", "url"):
            if src.get(field) is None and not (
                src.get("title_note") if field == "title" else src.get("provenance_note")
            ):
                problems.append(f"source {key}: {field} is null without a note saying why")
    for gpu, info in (pub.get("gpus") or {}).items():
        if info.get("source") not in sources:
            problems.append(f"gpu {gpu}: unknown source {info.get('source')!r}")
    stages = pub.get("stages") or []
    if not stages:
        problems.append("no stages")
    for st in stages:
        if not st.get("label"):
            problems.append(f"stage {st.get('id')!r}: no label")
        if st.get("source") not in sources:
            problems.append(f"stage {st.get('id')!r}: unknown source {st.get('source')!r}")
        if not (isinstance(st.get("requires"), dict) or st.get("requires") == "last"):
            problems.append(f"stage {st.get('id')!r}: requires must be a dict or 'last'")
        for gpu, ms in (st.get("ms_per_step") or {}).items():
            if gpu not in (pub.get("gpus") or {}):
                problems.append(f"stage {st.get('id')!r}: unknown gpu {gpu!r}")
            if ms is not None and not (isinstance(ms, (int, float)) and ms > 0):
                problems.append(f"stage {st.get('id')!r}: ms_per_step[{gpu}] must be > 0 or null")
    return problems


def matching_rung(results: dict, requires: dict | str) -> dict | None:
    """The measured row of ``results`` that corresponds to a published stage.

    ``requires`` = "last": the last measured rung. Otherwise {switch: accepted values}, or
    {switch: "on"} meaning "changed from the first row's value"; the first measured row whose
    (cumulative) switches satisfy every requirement is returned, None if there is none.
    """
    rows = measured_rows(results)
    if not rows:
        return None
    if requires == "last":
        return rows[-1]
    base = _switches(results["rungs"][0])
    for row in rows:
        sw = _switches(row)
        if all(
            (sw.get(k) != base.get(k)) if want == "on" else (sw.get(k) in want)
            for k, want in requires.items()
        ):
            return row
    return None


def comparison_rows(measured: dict[str, dict], published: dict | None) -> list[dict]:
    """One row per published stage: {"stage", "published": {gpu: ms or None},
    "measured": {label: {"ms", "speedup", "rung"} or None}}.

    ``measured`` maps a column label (e.g. "H200 B=16") to a ladder results dict. Published and
    measured figures live under different keys, so no column ever holds both. Measured speed-up is
    relative to that column's first measured rung; published speed-up to the published FP32 time.
    """
    if published is None:
        raise ValueError(f"no published figures: {PUBLISHED_FILE} was not found")
    gpus = list(published["gpus"])
    base_pub = {g: published["stages"][0]["ms_per_step"].get(g) for g in gpus}
    out = []
    for st in published["stages"]:
        row = {"stage": st["label"], "published": {}, "measured": {}}
        for g in gpus:
            ms = st["ms_per_step"].get(g)
            row["published"][g] = (
                None
                if ms is None
                else {"ms": float(ms), "speedup": base_pub[g] / ms if base_pub[g] else None}
            )
        for label, res in measured.items():
            m = matching_rung(res, st["requires"])
            first = measured_rows(res)[0]["ms_per_step"] if measured_rows(res) else None
            row["measured"][label] = (
                None
                if m is None
                else {
                    "ms": m["ms_per_step"],
                    "speedup": first / m["ms_per_step"],
                    "rung": m["name"],
                }
            )
        out.append(row)
    return out


COMPARISON_TITLE = (
    "ms per training step (speed-up over the same column's FP32 row); '-' = no such step"
)


def _stage_rungs(res: dict, rows: list[dict], label: str) -> list[str]:
    """The "stage = rung" text of each stage column ``label`` matched, with the rungs the ladder
    added since the previous stage's rung (the ladder is cumulative, so a stage's speed-up
    includes them), e.g. "+ mixed precision = + bf16 autocast (after + tf32)"; the last measured
    rung is "(the last rung of that run)"."""
    names = [r["name"] for r in measured_rows(res)]
    out, prev = [], 0
    for row in rows:
        if not row["measured"][label]:
            continue
        rung = row["measured"][label]["rung"]
        i = names.index(rung)
        if i == len(names) - 1 and i > 0:
            note = " (the last rung of that run)"
        else:
            extras = names[prev + 1 : i]
            note = f" (after {', '.join(extras)})" if extras else ""
        out.append(f"{row['stage']} = {rung}{note}")
        prev = i
    return out


def _comparison_parts(rows: list[dict], published: dict, measured: dict[str, dict]):
    """What both comparison tables show: (column heads, one list of cell strings per stage,
    the "published:" source lines, the "measured:" source lines)."""
    heads = [f"{g} published" for g in published["gpus"]] + [f"{m} measured" for m in measured]

    def cell(v):
        return (
            "-"
            if v is None
            else f"{v['ms']:.1f} ({v['speedup']:.2f}x)"
            if v["speedup"]
            else f"{v['ms']:.1f}"
        )

    cells = [
        [r["stage"]]
        + [cell(r["published"][g]) for g in published["gpus"]]
        + [cell(r["measured"][m]) for m in measured]
        for r in rows
    ]
    pub_lines = []
    for key in sorted({published["gpus"][g]["source"] for g in published["gpus"]}):
        src = published["sources"][key]
        title = src["title"] or f"untitled ({src.get('title_note', '')})"
        pub_lines.append(
            f"{key}: {title}; author: {src['author'] or 'not given'}; "
            f"url: {src['url'] or 'not given'}"
        )
    setup = published.get("setup", {})
    batch = setup.get("batch_size") or {}
    for g, info in published["gpus"].items():
        b = batch.get(g) if isinstance(batch, dict) else batch
        pub_lines.append(
            f"{g}: {info['name']}, T={setup.get('seq_len') or 'not stated'}, "
            f"B={b if b is not None else 'not stated'}"
        )
    if setup.get("compile_mode"):
        pub_lines.append(f"torch.compile mode: {setup['compile_mode']}")
    mes_lines = []
    for label, res in measured.items():
        cfg = res["config"]
        mapping = ", ".join(_stage_rungs(res, rows, label))
        mes_lines.append(
            f"{label}: {res['device']}, torch {res['torch']}, {res['date']}, "
            f"B={cfg['batch_size']}, T={cfg['seq_len']}; rungs: {mapping}"
        )
    return heads, cells, pub_lines, mes_lines


def format_comparison(rows: list[dict], published: dict, measured: dict[str, dict]) -> str:
    """The comparison as a text table: published columns first (A100, T4, labelled "published"),
    then measured columns (labelled "measured"), each cell "ms (speed-up)"; then where each number
    comes from and which measured rung each stage was matched to. :func:`comparison_markdown` is
    the same table for a rendered notebook."""
    heads, cells, pub_lines, mes_lines = _comparison_parts(rows, published, measured)
    w = max(18, *(len(c) for c in heads))
    head = f"{'stage':<26}" + "".join(f"{c:>{w + 2}}" for c in heads)
    lines = [COMPARISON_TITLE, head, "-" * len(head)]
    lines += [f"{c[0]:<26}" + "".join(f"{x:>{w + 2}}" for x in c[1:]) for c in cells]
    lines += ["published:", *(f"  {line}" for line in pub_lines)]
    lines += ["measured:", *(f"  {line}" for line in mes_lines)]
    return "\n".join(lines)


def comparison_markdown(rows: list[dict], published: dict, measured: dict[str, dict]) -> str:
    """:func:`format_comparison` as Markdown, for ``IPython.display.Markdown``: the same title, a
    real table (one column per GPU, published first) and the same sources as two lists."""
    heads, cells, pub_lines, mes_lines = _comparison_parts(rows, published, measured)
    table = pipe_table(["stage", *heads], cells, "l" + "r" * len(heads))
    return "\n\n".join(
        [
            COMPARISON_TITLE,
            table,
            "**published:**\n\n" + "\n".join(f"- {line}" for line in pub_lines),
            "**measured:**\n\n" + "\n".join(f"- {line}" for line in mes_lines),
        ]
    )
