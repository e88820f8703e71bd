"""The speed-up ladder: the course's main job (``python -m helpers.ladder``).

Each rung adds one switch to the rung before it and times the same full training step on real
Tiny Shakespeare batches. On a GPU the model is GPT-2 124M at T=1024; on a CPU it is the small
configuration of :func:`helpers.core.train.small_model_config`. A rung this hardware cannot run is
reported as ``skipped`` with the reason, never run in another mode.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import torch

from helpers import bench, switches
from helpers.core import data
from helpers.core.model import flops_per_token
from helpers.core.train import RunConfig, default_shapes, slow_reason, unsupported_reason
from helpers.measure import gpus, hardware, memory, results
from helpers.measure.results import markdown_table as pipe_table
from helpers.tools import cli

# (name, switches added on top of the previous rung), read from the switch registry
RUNGS: list[tuple[str, dict]] = switches.ladder_rungs()


FP16_AUTOCAST_RUNG = "+ fp16 autocast + GradScaler"  # the autocast rung where bf16 is not native


def autocast_rung(name: str, changes: dict, device: torch.device | None) -> tuple[str, dict]:
    """The autocast rung in the device's recipe dtype: bf16 where it is native (and when no device
    is given: the GPU ladder), else fp16 with a GradScaler, renamed so the table says which
    (``"+ fp16 autocast + GradScaler"``). Other rungs are returned unchanged."""
    if (
        changes.get("autocast") != "bf16"
        or device is None
        or device.type != "cuda"
        or hardware.native_bf16(device)
    ):
        return name, changes
    return FP16_AUTOCAST_RUNG, {
        **changes,
        "autocast": "fp16",
    }  # RunConfig(autocast="fp16") adds the GradScaler


# The compile mode of the "+ CUDA graphs" rung for each mode of the "+ torch.compile" rung: the same
# compilation with CUDA graphs on; a mode that already uses them has no such rung to add.
WITH_CUDA_GRAPHS = {"default": "reduce-overhead", "max-autotune-no-cudagraphs": "max-autotune"}


def compile_rung(changes: dict, compile_mode: str) -> dict:
    """A rung's changes with its ``compile`` value read against ``compile_mode`` (the mode of the
    "+ torch.compile" rung): the first compiled rung takes ``compile_mode``, the "+ CUDA graphs"
    rung (``"reduce-overhead"``) the same mode with CUDA graphs (:data:`WITH_CUDA_GRAPHS`), or
    ``compile_mode`` itself where that already uses them (the rung then changes nothing)."""
    value = changes.get("compile")
    if value is None:
        return changes
    if value == "reduce-overhead":
        return {**changes, "compile": WITH_CUDA_GRAPHS.get(compile_mode, compile_mode)}
    return {**changes, "compile": compile_mode}


def ladder_configs(
    batch_size: int,
    seq_len: int,
    compile_mode: str = "default",
    device: torch.device | str | None = None,
    run_slow: bool = False,
) -> list[tuple[RunConfig, str | None]]:
    """The ladder as cumulative RunConfigs, each with the reason it cannot run here (None if it
    can).

    Rung i = rung i-1 + one switch. A switch ``device`` cannot run (e.g. TF32 on a CPU) makes its
    rung skipped and is *not* carried into the later rungs, which build on the last runnable one.
    The "+ CUDA graphs" rung is the ``compile_mode`` with CUDA graphs (:func:`compile_rung`); with a
    mode that already uses them it is skipped as changing nothing.
    The autocast rung uses the device's recipe dtype (:func:`autocast_rung`): on a GPU without
    native bf16 (a T4, a V100, an emulated T4) it is "+ fp16 autocast + GradScaler", so the fp16
    path runs.
    A rung that runs but slowly here (bf16 on a CPU without fast bf16, :func:`train.slow_reason`) is
    skipped with that reason too, unless ``run_slow``.
    """
    device = torch.device(device) if device is not None else None
    configs, current = [], RunConfig(batch_size=batch_size, seq_len=seq_len)
    for name, changes in RUNGS:
        changes = compile_rung(changes, compile_mode)
        name, changes = autocast_rung(name, changes, device)
        candidate = current.replace(name=name, **changes)
        reason = unsupported_reason(candidate, device) if device is not None else None
        if changes.get("compile") is not None and changes["compile"] == current.compile:
            reason = f"compile mode {compile_mode!r} already uses CUDA graphs: nothing to add"
        if reason is None and device is not None and not run_slow:
            reason = slow_reason(candidate, device)
        configs.append((candidate, reason))
        if reason is None:
            current = candidate
    return configs


def last_runnable(
    batch_size: int,
    seq_len: int,
    device: torch.device | str,
    compile_mode: str = "default",
    taught_by: str | None = None,
) -> RunConfig:
    """The ladder's fastest configuration on ``device``: its last rung that can run here (every
    runnable switch on). Below compute capability 8.9 (T4, A100) that is not the last rung:
    "+ fp8 LM head", "+ fp8 MLP" and "+ fp8 fast accum" need fp8 tensor cores; on a T4 also
    "+ clip in AdamW" and "+ fused LM-head CE" need bf16 (no GradScaler).

    ``taught_by`` (a chapter number, "09"): the last runnable rung whose switches are all taught by
    that chapter (:func:`helpers.switches.taught_after`), e.g. what a learner of chapter 10 knows.

    Raises:
        ValueError: if no rung can run on ``device`` (under ``taught_by``, if given).
    """
    runnable = [
        run
        for run, reason in ladder_configs(batch_size, seq_len, compile_mode, device)
        if reason is None and (taught_by is None or not switches.taught_after(run, taught_by))
    ]
    if not runnable:
        by = f" with switches taught by chapter {taught_by}" if taught_by else ""
        raise ValueError(f"no rung of the ladder{by} can run on {device}")
    return runnable[-1]


def _short(name: str) -> str:
    return name.lstrip("+ ")


def names_autocast_rung(rungs: list[str] | None) -> bool:
    """Whether ``rungs`` (``--rungs`` names) asks for the autocast rung by one of its names."""
    names = {"autocast", "bf16 autocast", "fp16 autocast", _short(FP16_AUTOCAST_RUNG)}
    return any(_short(r).casefold() in names for r in rungs or ())


def select_rungs(configs: list[RunConfig], rungs: list[str]) -> list[RunConfig]:
    """The configs named in ``rungs`` (with or without the leading "+ ", in any letter case).
    "autocast", "bf16 autocast" and "fp16 autocast" all name the autocast rung, whichever dtype this
    device's ladder gives it.

    Raises:
        ValueError: a name that is no rung of this ladder.
    """

    def aliases(run: RunConfig) -> set[str]:
        names = {run.name, _short(run.name)}
        if run.autocast is not None and run.name in (
            FP16_AUTOCAST_RUNG,
            *(n for n, c in RUNGS if "autocast" in c),
        ):
            names |= {"autocast", "bf16 autocast", "fp16 autocast", _short(FP16_AUTOCAST_RUNG)}
        return {n.casefold() for n in names}

    known = set().union(*(aliases(c) for c in configs)) if configs else set()
    asked = {r.casefold() for r in rungs}
    unknown = sorted(r for r in rungs if r.casefold() not in known)
    if unknown:
        raise ValueError(
            f"unknown rung(s) {unknown}{_did_you_mean(unknown, configs)}; rungs are "
            f"{[_short(c.name) for c in configs]} "
            '(quote names with spaces: --rungs fp32 "bf16 autocast")'
        )
    return [c for c in configs if aliases(c) & asked]


def _did_you_mean(unknown: list[str], configs: list[RunConfig]) -> str:
    """' (did you mean ...?)' for names that are a rung's name but for spaces, hyphens, "+" and
    letter case, or close to one (difflib); else ''."""
    import difflib

    def squash(name: str) -> str:
        return "".join(ch for ch in name.casefold() if ch.isalnum() or ch == ".")

    by_squash = {squash(_short(c.name)): _short(c.name) for c in configs}
    guesses = []
    for name in unknown:
        close = difflib.get_close_matches(squash(name), list(by_squash), n=1, cutoff=0.8)
        if close:
            guesses.append(repr(by_squash[close[0]]))
    return f" (did you mean {', '.join(guesses)}?)" if guesses else ""


def run_ladder(
    batch_size: int | None = None,
    seq_len: int | None = None,
    device: str | torch.device | None = None,
    warmup: int = 3,
    iters: int = 10,
    rungs: list[str] | None = None,
    compile_mode: str = "default",
    progress: bool = True,
) -> dict:
    """Run the ladder and return the results dict (see README for its shape)."""
    from tqdm.auto import tqdm

    device = cli.device(device)
    model_config, default_b, default_t = default_shapes(device)
    B = default_b if batch_size is None else batch_size
    T = default_t if seq_len is None else seq_len
    for name, value, minimum in (("batch_size", B, 1), ("seq_len", T, 1), ("iters", iters, 1),
                                 ("warmup", warmup, 0)):  # fmt: skip
        cli.at_least(name, value, minimum)
    if T > model_config.block_size:
        raise ValueError(
            f"--seq-len {T} > block_size {model_config.block_size} of the {device.type} "
            "model config: "
            f"use --seq-len <= {model_config.block_size} here"
        )
    tokens = data.load_tokens()
    run_slow = names_autocast_rung(rungs)  # asked for by name: measured even where it is slow
    configs = [run for run, _ in ladder_configs(B, T, compile_mode, device, run_slow=run_slow)]
    if rungs:
        configs = select_rungs(configs, rungs)
    rows = []
    for run in tqdm(configs, desc="ladder", disable=not progress):
        rows.append(bench.measure(run, model_config, device, tokens, warmup, iters, run_slow))
    base = next((r["ms_per_step"] for r in rows if r["status"] == "measured"), None)
    for r in rows:
        if r["status"] == "measured" and base is not None:
            r["speedup"] = base / r["ms_per_step"]
    return {
        **results.provenance(device),
        "config": {
            "model": {
                k: v
                for k, v in model_config.__dict__.items()
                if k not in ("attention", "vocab_multiple")
            },
            "batch_size": B,
            "seq_len": T,
            "warmup_steps": warmup,
            "timed_steps": iters,
            "data": "Tiny Shakespeare, GPT-2 BPE, sequential batches",
            "step": "zero_grad, forward+loss, backward, gradient clipping to norm 1.0 "
            "(clip_grad_norm_, or inside fused AdamW from the '+ clip in AdamW' rung on), "
            "AdamW step",
            "timing": "median of timed steps; CUDA events on GPU, perf_counter on CPU",
            "flops_per_token": flops_per_token(model_config, T),
        },
        "rungs": rows,
    }


# The table's columns: (header, fixed-width format spec, Markdown alignment); "note" goes last.
_TABLE_COLUMNS = [
    ("rung", "<20", "l"),
    ("status", "<9", "l"),
    ("ms/step", ">9", "r"),
    ("spread", ">7", "r"),
    ("tokens/s", ">11", "r"),
    ("speed-up", ">8", "r"),
    ("MFU", ">6", "r"),
    ("peak mem", ">10", "r"),
    ("note", "", "l"),
]


def _is_ladder_prefix(names: list[str]) -> bool:
    """Whether ``names`` are the ladder's rungs in order from "fp32" with none left out (the
    fp16 autocast rung standing in for the bf16 one), so each row adds one switch to the row above.
    """
    order = [name for name, _ in RUNGS]
    names = ["+ bf16 autocast" if n == FP16_AUTOCAST_RUNG else n for n in names]
    return names == order[: len(names)]


def _table_parts(results: dict, from_rung: str | None = None):
    """What both tables show: (device line, lines above the table, one list of cell strings per
    rung, lines below), so the text and the Markdown table can never disagree."""
    rungs = results["rungs"]
    base = next((r["name"] for r in rungs if r["status"] == "measured"), None)
    cfg = results["config"]
    device = (results["device"], results["torch"], cfg["batch_size"], cfg["seq_len"])
    above = [
        f"speed-up is relative to the first measured rung ({base}); "
        "spread = (max - min) / median of the timed steps"
        if base is not None
        else "no rung was measured here (see the reasons below)"
    ]
    measured = [r for r in rungs if r["status"] == "measured"]
    shared = {r["reason"] for r in measured}
    # e.g. why no MFU: said once
    shared_note = shared.pop() if len(shared) == 1 and len(measured) > 1 else "ok"
    if shared_note != "ok":
        above.append(f"note for every measured rung: {shared_note}")
    if not _is_ladder_prefix([r["name"] for r in rungs]):
        above.append(
            "rungs are cumulative: each also has the switches of every rung before it in the "
            "ladder, listed here or not (python -m helpers.ladder --help lists them in order)"
        )
    if measured and all(r.get("peak_mem_bytes") is None for r in measured):
        above.append("peak mem: read from CUDA's caching allocator, so on a GPU only")
    if from_rung is not None:
        names = [r["name"] for r in rungs]
        if from_rung not in names:
            raise ValueError(f"no rung named {from_rung!r} in this ladder: {names}")
        rungs = rungs[names.index(from_rung) :]
    cells = []
    for r in rungs:
        if r["status"] == "measured":
            cells.append(
                [
                    r["name"],
                    r["status"],
                    f"{r['ms_per_step']:.1f}",
                    f"{r.get('spread_pct', 0):.0f}%",
                    f"{r['tokens_per_s']:,.0f}",
                    f"{r['speedup']:.2f}x",
                    f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-",
                    memory.format_bytes(r["peak_mem_bytes"]),
                    "" if r["reason"] in ("ok", shared_note) else r["reason"],
                ]
            )
        else:
            cells.append([r["name"], r["status"], *["-"] * 6, r["reason"]])
    below = []
    noisy = [r["name"] for r in rungs if r["status"] == "measured" and r.get("spread_pct", 0) > 25]
    if noisy:
        where = (
            "the CPU was shared"
            if str(results.get("device", "")).startswith("cpu")
            else "the GPU was not warm"
        )
        below.append(
            f"warning: steps varied by more than 25% in {noisy}: the machine was busy or {where}; "
            "time more steps (--iters, or iters= of run_ladder) before trusting small differences"
        )
    return device, above, cells, below


def format_table(results: dict, from_rung: str | None = None) -> str:
    """The results as a fixed-width text table (one line per rung; from the rung named
    ``from_rung`` on, if given: speed-ups stay relative to the first measured rung).
    :func:`markdown_table` is the same table for a rendered notebook.

    Raises:
        ValueError: ``from_rung`` names no rung of ``results``.
    """
    (name, torch_version, b, t), above, cells, below = _table_parts(results, from_rung)
    head = " ".join(f"{h:{spec}}" for h, spec, _ in _TABLE_COLUMNS[:-1]) + "  note"
    lines = [f"{name} | torch {torch_version} | B={b} T={t} | {results['date']}", *above]
    lines += [head, "-" * len(head)]
    for row in cells:
        specs = [spec for _, spec, _ in _TABLE_COLUMNS[:-1]]
        fixed = " ".join(f"{c:{spec}}" for c, spec in zip(row[:-1], specs, strict=True))
        lines.append(f"{fixed}  {row[-1]}")
    # a warning is one long sentence: wrapped, so a notebook's output does not clip it
    wrapped = [textwrap.fill(line, 100, subsequent_indent="  ") for line in below]
    return "\n".join(lines + wrapped)


def markdown_table(results: dict, from_rung: str | None = None) -> str:
    """:func:`format_table` as Markdown, for ``IPython.display.Markdown``: the device line, the
    notes, then a real table (rung names in code font; no "note" column when no rung has a note),
    then any warning. A rendered notebook shows it as a table where the fixed-width text would
    wrap.

    Raises:
        ValueError: ``from_rung`` names no rung of ``results``.
    """
    (name, torch_version, b, t), above, cells, below = _table_parts(results, from_rung)
    columns = _TABLE_COLUMNS if any(row[-1] for row in cells) else _TABLE_COLUMNS[:-1]
    rows = [[f"`{row[0]}`", *row[1 : len(columns)]] for row in cells]
    table = pipe_table([h for h, _, _ in columns], rows, "".join(a for _, _, a in columns))
    head = f"**{name}**, torch {torch_version}, B={b}, T={t}, {results['date']}"
    return "\n\n".join([head, *above, table, *below])


class _NoHyphenBreaks(argparse.HelpFormatter):
    """argparse's help layout, wrapping lines at spaces only: a rung name such as 'one-pass QKV
    grad' stays whole, so it can be copied from ``--help``."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m helpers.ladder",
        formatter_class=_NoHyphenBreaks,
        description="Time the GPT-2 speed-up ladder on this machine "
        "(real Tiny Shakespeare batches). GPU: GPT-2 124M at T=1024. "
        "CPU: the small course configuration.",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="B, sequences per step (default: train.default_shapes: 16 on a 40 GB or larger GPU, "
        "less where the fp32 rung would not fit, e.g. 4 on a T4; 4 on a CPU)",
    )
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="T, tokens per sequence (default: 1024 on a GPU, 128 on a CPU)",
    )
    p.add_argument(
        "--device", default=None, help="'cuda', 'cuda:1' or 'cpu' (default: cuda if available)"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed warm-up steps per rung (default 3; compile happens here)",
    )
    p.add_argument(
        "--iters",
        type=int,
        default=10,
        help="timed steps per rung; the median is reported (default 10)",
    )
    p.add_argument(
        "--rungs",
        nargs="+",
        default=None,
        help="run only these rungs, by name (any case), quoted where they contain spaces "
        "(default: all): "
        + ", ".join(repr(n.lstrip("+ ")) for n, _ in RUNGS)
        + "; 'autocast' names the autocast rung in either dtype "
        "(fp16 + GradScaler where bf16 is not native); "
        "on a CPU without fast bf16 the bf16 rungs are skipped "
        "unless the autocast rung is named here",
    )
    p.add_argument(
        "--compile-mode",
        default="default",
        choices=["default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead"],
        help="torch.compile mode of the compiled rungs (default: 'default')",
    )
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON to this file")
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="save a bar chart of ms/step per rung to this PNG file",
    )
    p.add_argument(
        "--emulate",
        default=None,
        metavar="PROFILE",
        choices=sorted(k for k, prof in gpus.PROFILES.items() if prof.capability),
        help="emulate a smaller GPU on this one "
        "(e.g. T4: 15 GB memory cap, no bf16/TF32, sm75 attention kernels); "
        "speed stays this GPU's, so no MFU is reported (also: $COURSE_EMULATE_GPU). "
        "One of: %(choices)s",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    cli.add_force(p, "--out/--plot")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        # refused now, not after the whole ladder ran: a folder, another kind of existing file
        args.out = cli.result_out(args.out, ("rungs",), force=args.force)
        # matplotlib would add ".png" itself, silently
        if args.plot is not None and not Path(args.plot).is_dir() and not Path(args.plot).suffix:
            args.plot = Path(args.plot).with_suffix(".png")
        args.plot = cli.out_path(
            args.plot, "--plot", suffix=".png", force=args.force, png_kind="ladder"
        )
        emulated = (
            hardware.emulate(args.emulate, args.device or "cuda")
            if args.emulate
            else hardware.apply_env_emulation(args.device or "cuda")
        )
        results = run_ladder(
            args.batch_size,
            args.seq_len,
            args.device,
            args.warmup,
            args.iters,
            args.rungs,
            args.compile_mode,
            progress=not args.no_progress,
        )
    except (ValueError, data.paths.DataFileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if emulated:
        results["emulated"] = emulated
        results["device"] = f"{emulated['real_gpu']} emulating {emulated['profile']}"
    print(format_table(results))
    if not any(r["status"] == "measured" for r in results["rungs"]):
        # nothing to keep: an earlier result at --out / --plot stays as it was
        print(
            "error: no rung could be measured (see the reasons above); nothing written",
            file=sys.stderr,
        )
        return 1
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        cli.replace_file(args.out, lambda f: f.write(json.dumps(results, indent=2) + "\n"))
        print(f"wrote {args.out}")
    if args.plot:
        from helpers.measure import plots

        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plots.ladder_bars(results, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
