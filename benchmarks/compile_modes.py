"""torch.compile modes on the course's step: cold compile time and step time, as JSON (chapter 05).

    python benchmarks/compile_modes.py --modes eager default reduce-overhead \\
        --out results/h200-compile-modes.json
    python benchmarks/compile_modes.py --modes max-autotune-no-cudagraphs \\
        --out results/h200-compile-modes.json --force

The step is ``helpers.chapters.ch05_compile.chapter_run`` (GPT-2 124M, B=16, T=1024, TF32 + bf16
autocast, manual attention on a GPU; the small CPU configuration on a CPU). Each mode is built
afresh (``train.build`` resets Dynamo) and compiled with an empty inductor cache
(``compilation.cold_compile_cache``), so its compile time is a cold one. A file already at ``--out``
from the same device and torch version keeps its rows for the modes not run now, so slow modes can
be measured in a separate command (max-autotune-no-cudagraphs takes minutes on an H200); a file
in a checkout's ``results/`` is replaced only with ``--force``, as every benchmark's ``--out`` is.
"""

from __future__ import annotations

import argparse
import json
import sys

from helpers.chapters import ch05_compile as compilation
from helpers.core import data, train
from helpers.measure import hardware, results
from helpers.tools import cli

MODES = ("eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--modes", nargs="+", default=["eager", "default", "reduce-overhead"], choices=MODES
    )
    results.add_out(p, required=True)
    p.add_argument("--iters", type=int, default=10, help="timed steps per mode (median reported)")
    args = p.parse_args(argv)
    if args.iters < 1:
        p.error(f"need --iters >= 1, got --iters {args.iters}")
    args.out = results.checked_out(p, args.out, args.force, kind=("what", "config", "rows"))
    device = hardware.default_device()
    model_config, _, _ = train.default_shapes(device)
    tokens = data.load_tokens()
    meta = {
        **results.provenance(device),
    }
    rows = []
    if cli.is_course_result(args.out):
        old = json.loads(args.out.read_text())
        old_rows = old.get("rows")
        ours = isinstance(old_rows, list) and all(
            isinstance(r, dict) and r.get("mode") in MODES for r in old_rows
        )
        if not ours:
            print(f"{args.out} holds no rows of this tool: replacing it", file=sys.stderr)
        elif (old.get("device"), old.get("torch")) == (meta["device"], meta["torch"]):
            rows = [r for r in old_rows if r["mode"] not in args.modes]
            print(
                f"keeping {len(rows)} row(s) of {args.out} "
                f"({', '.join(r['mode'] for r in rows) or 'none'})"
            )
        else:
            print(
                f"{args.out} is from {old.get('device')} / torch {old.get('torch')}: replacing it",
                file=sys.stderr,
            )
    for mode in args.modes:
        run = compilation.chapter_run(device, None if mode == "eager" else mode)
        row = compilation.measure_step(
            run, model_config, device, tokens, iters=args.iters, warmup=2
        )
        row["date"] = meta["date"]
        rows.append(row)
        print(compilation.format_rows([row]).splitlines()[-1], flush=True)
        if mode != "eager" and row["status"] == "measured" and not row["compiled"]:
            print(
                f"  warning: {mode} did not compile here ({row['reason']}); "
                "the row is labelled eager",
                file=sys.stderr,
            )
    order = {m: i for i, m in enumerate(MODES)}
    rows.sort(key=lambda r: order.get(r["mode"], len(MODES)))
    run = compilation.chapter_run(device)
    out = {
        **meta,
        "what": (
            "training step (zero_grad, forward+loss, backward, clip, AdamW): first step (compiles, "
            "cold inductor cache) timed alone, then median of timed steps after 2 warm-up steps"
        ),
        "config": {
            "model": model_config.__dict__,
            "batch_size": run.batch_size,
            "seq_len": run.seq_len,
            "matmul_precision": run.matmul_precision,
            "autocast": run.autocast,
            "attention": run.attention,
            "optimizer": run.optimizer,
            "timed_steps": args.iters,
        },
        "rows": rows,
    }
    print(compilation.format_rows(rows))
    results.save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
