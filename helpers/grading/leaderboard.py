"""The class leaderboard (``python -m helpers.grading leaderboard SUBMISSIONS``): every learner's
capstone ladder, checked, then ranked per GPU model.

The capstone (notebooks/12_capstone_ladder.ipynb) saves its ladder results dict
(:func:`helpers.ladder.run_ladder`) with :func:`save` as :data:`SUBMISSION_FILE` in the
notebook's folder; the learner hands it in with the notebook:
``SUBMISSIONS/<student id>/capstone-ladder.json``.
Files are only read as JSON, never executed. :func:`validate` refuses a ladder that is malformed,
lacks its provenance, is internally inconsistent, claims more FLOP/s than the GPU's datasheet peak,
or was measured on an emulated GPU; :func:`collect` also refuses copies. Refused submissions are
listed in the CSV with their reasons and never ranked. What this can and cannot catch:
docs/grading.md ("The class leaderboard").
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.core.model import GPTConfig, flops_per_token
from helpers.grading.kernel import first_line
from helpers.measure import gpus, plots
from helpers.tools import cli

SUBMISSION_FILE = "capstone-ladder.json"  # what the capstone writes and the leaderboard reads
MAX_BYTES = 1 << 20  # larger files are not read (a 13-rung ladder is about 20 kB)
# A rung with one of these switches on may run at the datasheet's dense fp8 peak.
FP8_SWITCHES = ("lm_head_fp8", "mlp_fp8")
TOLERANCE = 0.02  # relative: tokens/s against B*T/(ms/1000), speed-up against the first rung's
STATUSES = ("measured", "skipped", "failed")  # a rung's status (helpers/bench.py)
PROVENANCE = ("device", "torch", "date")  # recorded by helpers.measure.results.provenance
MODEL_KEYS = ("vocab_size", "n_layer", "n_head", "n_embd")  # with T, they set flops_per_token
# the CSV's columns, one row per learner (rank)
COLUMNS = (
    "gpu_model flops_per_token student status rank_tokens_per_s best_tokens_per_s best_rung "
    "rank_speedup speedup_over_fp32 batch_size seq_len device torch date reasons"
).split()


@dataclass
class Entry:
    """One learner's submission: the file read, the ladder it holds, and the verdict."""

    student: str  # the student's folder name
    path: Path | None  # the file read; None when none was found
    record: Any = None  # the parsed JSON; None when the file could not be read
    problems: list[str] = field(default_factory=list)  # why it is refused; [] = ranked
    notes: list[str] = field(default_factory=list)  # checks that could not be made


def save(results: dict, path: str | Path = SUBMISSION_FILE) -> Path:
    """Write a ladder results dict (:func:`helpers.ladder.run_ladder`) as JSON to ``path``
    (default: ``capstone-ladder.json`` in the current folder, which in a notebook is the
    notebook's) and return ``path``. That file is the learner's leaderboard submission."""
    path = Path(path)
    path.write_text(json.dumps(results, indent=2) + "\n")
    return path


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _positive(x: Any, kind: type | tuple[type, ...] = (int, float)) -> bool:
    return _number(x) and isinstance(x, kind) and x > 0


def _bytes(x: Any) -> bool:
    return _number(x) and isinstance(x, int) and x >= 0


def _text(x: Any) -> bool:
    return isinstance(x, str) and bool(x.strip())


def _measured(record: Any) -> list[dict]:
    rungs = record.get("rungs") if isinstance(record, dict) else None
    rungs = rungs if isinstance(rungs, list) else []
    return [r for r in rungs if isinstance(r, dict) and r.get("status") == "measured"]


def is_emulated(record: dict) -> bool:
    """Whether the ladder ran under an emulated GPU profile (its "emulated" key, or a device named
    "<GPU> emulating <profile>"): its speed is the real GPU's, not the emulated one's."""
    return bool(record.get("emulated")) or " emulating " in str(record.get("device", ""))


def peak_flops(record: dict) -> tuple[float | None, str]:
    """The dense 16-bit tensor-core datasheet peak of the record's device in FLOP/s (MFU's
    denominator, :class:`helpers.measure.gpus.GPUProfile`) and its source; or None and why no
    peak applies: an emulated record, or a device with no datasheet peak in ``gpus.PROFILES``."""
    if is_emulated(record):
        return None, f"emulated GPU ({record.get('device')}): its speed is another GPU's"
    profile = gpus.match_profile(str(record.get("device", "")))
    if profile is None or profile.peak_tensor_tflops is None:
        return None, f"no datasheet peak for {record.get('device')!r} in helpers/measure/gpus.py"
    return profile.peak_tensor_tflops * 1e12, f"{profile.name} ({profile.source})"


def gpu_model(record: dict) -> str:
    """The group a record is ranked in: the datasheet profile's key ("H200"), else the device
    name as recorded."""
    profile = gpus.match_profile(str(record.get("device", "")))
    return profile.key if profile is not None else str(record.get("device", "?"))


def validate(record: Any) -> list[str]:
    """What is wrong with one ladder results dict, one line each ([] = nothing found):

    - schema: a JSON object with ``device``, ``torch`` and an ISO ``date``; ``config`` with
      ``batch_size`` B and ``seq_len`` T (ints > 0), ``flops_per_token`` (FLOPs) equal to
      :func:`helpers.core.model.flops_per_token` of ``config.model`` at T; ``rungs``, each with a
      name and a status, at least one measured, each measured one with ``ms_per_step`` (ms),
      ``tokens_per_s`` and ``speedup`` (x) finite and > 0 and ``peak_mem_bytes`` (bytes) an int or
      None;
    - consistency: each measured rung's tokens/s within :data:`TOLERANCE` of B*T/(ms/1000), and its
      speed-up of the first measured rung's ms / its own;
    - physics: flops_per_token * tokens/s must not exceed the device's datasheet peak
      (:func:`peak_flops`; twice it for a rung with an fp8 switch on under bf16 autocast, on a GPU
      of compute capability >= 8.9: dense fp8 is twice dense bf16 on the H100/H200 and L4
      datasheets, so this bound never refuses a real fp8 run);
    - an emulated record is refused: its speed is the real GPU's, so it has no GPU model to be
      ranked in.
    """
    if not isinstance(record, dict):
        return [f"not a ladder: the file holds a JSON {type(record).__name__}, not an object"]
    problems = [
        f"provenance: no {key!r} recorded" for key in PROVENANCE if not _text(record.get(key))
    ]
    if _text(record.get("date")):
        try:
            datetime.date.fromisoformat(record["date"][:10])
        except ValueError:
            problems.append(f"provenance: date {record['date']!r} is not an ISO date (YYYY-MM-DD)")
    if is_emulated(record):
        problems.append(
            f"emulated GPU ({record.get('device')}): its timings are the real GPU's, so it is not "
            "ranked; submit a ladder run without emulation"
        )
    config = record.get("config")
    config_ok = (
        isinstance(config, dict)
        and all(_positive(config.get(k), int) for k in ("batch_size", "seq_len"))
        and _positive(config.get("flops_per_token"))
    )
    if not config_ok:
        problems.append(
            "config: batch_size and seq_len (ints > 0) and flops_per_token (> 0) are required"
        )
    else:
        problems += _flops_problems(config)
    rungs = record.get("rungs")
    if not isinstance(rungs, list) or not rungs:
        return [*problems, "rungs: a non-empty list of rungs is required"]
    if not all(
        isinstance(r, dict) and _text(r.get("name")) and r.get("status") in STATUSES for r in rungs
    ):
        return [*problems, f"rungs: each rung needs a name and a status, one of {STATUSES}"]
    measured = _measured(record)
    if not measured:
        return [*problems, "no measured rung"]
    bad = [
        r["name"]
        for r in measured
        if not all(_positive(r.get(k)) for k in ("ms_per_step", "tokens_per_s", "speedup"))
        or not (r.get("peak_mem_bytes") is None or _bytes(r["peak_mem_bytes"]))
    ]
    if bad:
        return [
            *problems,
            f"rungs {bad}: a measured rung needs ms_per_step, tokens_per_s and speedup "
            "(finite numbers > 0) and peak_mem_bytes (an int >= 0, or null on a CPU)",
        ]
    if config_ok:
        problems += _consistency_problems(measured, config)
        problems += _speed_problems(record, measured, config["flops_per_token"])
    return problems


def _flops_problems(config: dict) -> list[str]:
    model = config.get("model")
    try:
        shape = GPTConfig(**{k: model[k] for k in MODEL_KEYS})
        expected = flops_per_token(shape, config["seq_len"])
    except (TypeError, ValueError, KeyError):
        return ["config.model: no GPT-2 shape (vocab_size, n_layer, n_head, n_embd) recorded"]
    if config["flops_per_token"] != expected:
        return [
            f"config: flops_per_token {config['flops_per_token']:,} is not the recorded model's "
            f"{expected:,} at T={config['seq_len']} (helpers.core.model.flops_per_token)"
        ]
    return []


def _consistency_problems(measured: list[dict], config: dict) -> list[str]:
    B, T = config["batch_size"], config["seq_len"]
    base, problems = measured[0]["ms_per_step"], []
    for r in measured:
        ms, name = r["ms_per_step"], r["name"]
        tokens = B * T / (ms / 1e3)
        if abs(r["tokens_per_s"] / tokens - 1) > TOLERANCE:
            problems.append(
                f"{name}: tokens_per_s {r['tokens_per_s']:,.0f} is not B*T/(ms/1000) = "
                f"{tokens:,.0f} (B={B}, T={T}, {ms:.3f} ms/step)"
            )
        if abs(r["speedup"] / (base / ms) - 1) > TOLERANCE:
            problems.append(
                f"{name}: speedup {r['speedup']:.3f}x is not the first measured rung's "
                f"{base:.3f} ms / {ms:.3f} ms = {base / ms:.3f}x"
            )
    return problems


def _speed_problems(record: dict, measured: list[dict], fpt: float) -> list[str]:
    peak, source = peak_flops(record)
    if peak is None:
        return []  # said by unchecked()
    problems = []
    profile = gpus.match_profile(str(record.get("device", "")))
    fp8_cores = profile is not None and (profile.capability or (0, 0)) >= (8, 9)
    for r in measured:
        chosen = r.get("switches") if isinstance(r.get("switches"), dict) else {}
        # the fp8 allowance needs a GPU that has fp8 tensor cores and the rung the ladder runs
        # fp8 in: an fp8 switch on, under bf16 autocast
        fp8 = (
            fp8_cores
            and chosen.get("autocast") == "bf16"
            and any(chosen.get(field) is True for field in FP8_SWITCHES)
        )
        ceiling, rate = peak * (2 if fp8 else 1), fpt * r["tokens_per_s"]
        if rate > ceiling:
            problems.append(
                f"{r['name']}: {r['tokens_per_s']:,.0f} tokens/s x {fpt:,} FLOPs/token = "
                f"{rate / 1e12:,.0f} TFLOP/s, above the {ceiling / 1e12:,.1f} TFLOP/s datasheet "
                f"peak{' (x2 for fp8)' if fp8 else ''} of the {source}: faster than possible"
            )
    return problems


def unchecked(record: Any) -> list[str]:
    """The checks :func:`validate` could not make on ``record`` (said, never passed silently)."""
    if not isinstance(record, dict):
        return []
    peak, why = peak_flops(record)
    return [] if peak is not None else [f"peak check not possible: {why}"]


def read_submission(path: Path, root: Path) -> tuple[Any, list[str]]:
    """The JSON in ``path`` (a file in the submissions folder ``root``), or None and why it was not
    read: a link to outside ``root``, not a regular file, over :data:`MAX_BYTES`, not UTF-8 JSON."""
    try:
        real, top = path.resolve(), root.resolve()
    except (OSError, RuntimeError) as exc:  # a link loop
        return None, [f"{path.name} cannot be resolved: {exc}"]
    if top not in real.parents:
        return None, [f"{path.name} links to {real}, outside the submissions folder: not read"]
    try:
        info = os.stat(real)
        if not stat.S_ISREG(info.st_mode):
            return None, [f"{path.name} is not a regular file: not read"]
        if info.st_size > MAX_BYTES:
            return None, [f"{path.name} has {info.st_size:,} bytes, over {MAX_BYTES:,}: not read"]
        with open(real, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        return None, [f"{path.name} cannot be read: {exc.strerror or exc}"]
    if len(data) > MAX_BYTES:
        return None, [f"{path.name} has over {MAX_BYTES:,} bytes: not read"]
    try:
        return json.loads(data.decode("utf-8")), []
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, [f"{path.name} is not valid JSON: {first_line(str(exc))}"]


def collect(submissions: str | Path) -> list[Entry]:
    """Read and validate ``submissions/<student>/capstone-ladder.json`` for every student folder
    (or ``<student>/<one sub-folder>/capstone-ladder.json``, nbgrader's layout), in name order.
    Submissions whose measured rungs have identical names and ms/step (a copy) are all refused.

    Raises:
        FileNotFoundError: ``submissions`` is not a folder, or holds no student folder.
    """
    root = Path(submissions)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder of student folders")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise FileNotFoundError(f"{root} has no student folders ({root}/<student id>/)")
    entries = []
    for folder in folders:
        direct = folder / SUBMISSION_FILE
        found = [direct] if os.path.lexists(direct) else sorted(folder.glob(f"*/{SUBMISSION_FILE}"))
        if len(found) != 1:
            why = f"no {SUBMISSION_FILE} submitted" if not found else f"{len(found)} copies found"
            entries.append(Entry(folder.name, None, problems=[why]))
            continue
        record, problems = read_submission(found[0], root)
        entry = Entry(folder.name, found[0], record, problems)
        if not problems:
            entry.problems, entry.notes = validate(record), unchecked(record)
        entries.append(entry)
    by_timings: dict[str, list[Entry]] = {}
    for e in entries:
        timings = [[r.get("name"), r.get("ms_per_step")] for r in _measured(e.record)]
        if timings:
            by_timings.setdefault(json.dumps(timings), []).append(e)
    for same in by_timings.values():
        for e in same if len(same) > 1 else []:
            others = ", ".join(o.student for o in same if o is not e)
            e.problems.append(
                f"identical rung timings to {others}'s submission: a copy (all refused)"
            )
    return entries


def rank(entries: Iterable[Entry]) -> list[dict[str, Any]]:
    """The leaderboard as CSV rows (:data:`COLUMNS`): valid entries grouped by GPU model and
    FLOPs per token (the same model and T), each group ranked by best tokens/s (its fastest
    measured rung) and by speed-up over the learner's own fp32 rung (blank where that rung was not
    measured); then every refused entry with its reasons, unranked."""
    ranked, refused = [], []
    for e in entries:
        rec = e.record if isinstance(e.record, dict) else {}
        config = rec.get("config") if isinstance(rec.get("config"), dict) else {}
        row = dict.fromkeys(COLUMNS, "")
        row.update(
            student=e.student,
            device=rec.get("device", ""),
            torch=rec.get("torch", ""),
            date=rec.get("date", ""),
            batch_size=config.get("batch_size", ""),
            seq_len=config.get("seq_len", ""),
        )
        if e.problems:
            refused.append({**row, "status": "refused", "reasons": "; ".join(e.problems)})
            continue
        best = max(_measured(rec), key=lambda r: r["tokens_per_s"])
        fp32 = next((r for r in _measured(rec) if r["name"] == "fp32"), None)
        speedup = fp32["ms_per_step"] / best["ms_per_step"] if fp32 else None
        row.update(gpu_model=gpu_model(rec), flops_per_token=config["flops_per_token"])
        row.update(status="ranked", best_tokens_per_s=round(best["tokens_per_s"]))
        row.update(best_rung=best["name"], reasons="; ".join(e.notes))
        row["speedup_over_fp32"] = "" if speedup is None else round(speedup, 2)
        ranked.append(row)
    out = []
    for group in _groups(ranked).values():
        rows = sorted(group, key=lambda r: (-r["best_tokens_per_s"], r["student"]))
        for i, row in enumerate(rows, 1):
            row["rank_tokens_per_s"] = i
        with_speedup = [r for r in rows if r["speedup_over_fp32"] != ""]
        for i, row in enumerate(sorted(with_speedup, key=lambda r: -r["speedup_over_fp32"]), 1):
            row["rank_speedup"] = i
        out += rows
    return out + sorted(refused, key=lambda r: r["student"])


def _groups(rows: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Ranked rows by (GPU model, FLOPs per token), in that key's order."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: (str(r["gpu_model"]), str(r["flops_per_token"]))):
        groups.setdefault((row["gpu_model"], row["flops_per_token"]), []).append(row)
    return groups


def write_csv(rows: Iterable[dict[str, Any]], path: str | Path) -> None:
    """Write the leaderboard rows of :func:`rank` with the columns :data:`COLUMNS`. No text cell
    is a spreadsheet formula (:func:`helpers.grading.intake.csv_cell`): a submission writes the
    device name and torch version, and a rung name such as "+ tf32" would itself be read as one
    (it is shown as text, with a leading quote)."""
    from helpers.grading.intake import csv_cell

    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: csv_cell(v) for k, v in row.items()} for row in rows)


def plot(rows: list[dict[str, Any]], path: str | Path | None = None):
    """One figure: per GPU model (and FLOPs per token), a horizontal bar per ranked learner of best
    tokens/s, fastest on top, labelled with the speed-up over the learner's own fp32 rung (x) and
    the rung; refused learners are named under it. Returns the Figure; saves a PNG at ``path``."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    ranked = [r for r in rows if r["status"] == "ranked"]
    groups = _groups(ranked)  # rows keep rank()'s order inside each group
    sizes = [len(g) for g in groups.values()] or [1]
    height = 1.4 + 0.55 * sum(sizes) + 0.9 * len(sizes)
    fig, axes = plt.subplots(len(sizes), 1, figsize=(10, height), squeeze=False,
                             gridspec_kw={"height_ratios": sizes})  # fmt: skip
    for ax, ((gpu, fpt), group) in zip(axes[:, 0], groups.items(), strict=False):
        top = max(r["best_tokens_per_s"] for r in group)  # each GPU model on its own scale
        names = [f"#{r['rank_tokens_per_s']} {r['student']}" for r in group]
        ax.barh(names, [r["best_tokens_per_s"] for r in group], color="tab:blue")
        for y, r in enumerate(group):
            x = r["speedup_over_fp32"]
            label = f"{r['best_tokens_per_s']:,} tokens/s, " + (
                f"{x:.2f}x over own fp32 (#{r['rank_speedup']} by speed-up)"
                if x != ""
                else "no fp32 rung"
            )
            label += f"\n{r['best_rung']}, B={r['batch_size']}" + (" *" if r["reasons"] else "")
            at = (r["best_tokens_per_s"], y)
            ax.annotate(label, at, xytext=(4, 0), textcoords="offset points", va="center", size=8)
        ax.invert_yaxis()
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_xlim(0, top * 2.1)
        ax.set_title(f"{gpu} ({fpt / 1e6:,.0f} MFLOP per token)", fontsize=10, loc="left")
        ax.set_xlabel("best tokens/s (fastest measured rung of the learner's ladder)")
    if not groups:
        axes[0, 0].text(0.5, 0.5, "no valid submission", ha="center", va="center")
        axes[0, 0].set_axis_off()
    refused = [r["student"] for r in rows if r["status"] == "refused"]
    foot = (
        f"refused, not ranked ({len(refused)}): {', '.join(refused) or 'none'} (reasons in the CSV)"
    )
    if any(r["reasons"] for r in ranked):
        foot += "\n* a check was not possible (see the CSV's reasons)"
    fig.suptitle("Class leaderboard: capstone ladders, per GPU model", fontsize=11)
    fig.text(0.01, 0.01, foot, fontsize=8, va="bottom")
    fig.tight_layout(rect=(0, 0.04 + 0.02 * foot.count("\n"), 1, 1))
    if path is not None:
        plots.save_png(fig, path, "leaderboard")
        plt.close(fig)
    return fig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``leaderboard`` sub-command's arguments (``python -m helpers.grading leaderboard``)."""
    parser.add_argument("submissions", help=f"folder of <student id>/{SUBMISSION_FILE}")
    parser.add_argument("--csv", default="leaderboard.csv", help="default: leaderboard.csv")
    parser.add_argument("--png", default="leaderboard.png", help="default: leaderboard.png")
    parser.add_argument("--force", action="store_true", help="replace existing --csv/--png files")


def command(args: argparse.Namespace) -> None:
    """Run the ``leaderboard`` sub-command: check both outputs before reading anything.

    Raises:
        ValueError: an output inside the submissions folder, a folder, an existing file without
            ``--force``, a --png not ending in .png, or --csv and --png naming the same file.
        FileNotFoundError: no submissions folder, or no student folder in it.
    """
    submissions, out_csv, out_png = Path(args.submissions), Path(args.csv), Path(args.png)
    if out_csv.resolve() == out_png.resolve():
        raise ValueError(f"--csv and --png both name {out_csv}: give two files")
    for path, flag, suffix in ((out_csv, "--csv", ".csv"), (out_png, "--png", ".png")):
        # makes the folders; refuses unwritable ones and existing files without --force
        cli.out_path(
            path,
            flag,
            suffix,
            force=args.force,
            folders={submissions: "submissions"},
            png_kind="leaderboard",
            # its own earlier CSV (same columns) is replaced; any other needs --force
            same_kind=(lambda p: cli.csv_has_header(p, COLUMNS)) if suffix == ".csv" else None,
        )
    rows = rank(collect(submissions))
    write_csv(rows, out_csv)
    plot(rows, out_png)
    for r in rows:
        verdict = (
            f"#{r['rank_tokens_per_s']} on {r['gpu_model']}: {r['best_tokens_per_s']:,} tokens/s"
            if r["status"] == "ranked"
            else f"refused: {r['reasons']}"
        )
        print(f"{r['student']}: {verdict}")
    ranked = sum(r["status"] == "ranked" for r in rows)
    print(f"wrote {out_csv} and {out_png} ({ranked} ranked, {len(rows) - ranked} refused)")
