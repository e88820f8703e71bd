"""Same speed before and after a refactor: ladder rungs from two checkouts, timed alternately.

    python benchmarks/ab_ladder.py --old ../old-checkout --new . --batch-size 16 64 \\
        --rungs "fused LM-head CE" "fp8 LM head" --rounds 2 --out ab.json

Each round runs ``python -m helpers.ladder`` once per checkout and batch size, in a fresh
process (its own compiled graphs, its own CUDA context), alternating old and new and swapping
which goes first every round, so a drift of the GPU (clocks, temperature) falls on both. The
JSON holds every run's rows and, per batch size and rung, the medians of the old and new
ms/step and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from helpers.measure import results


def ladder_rows(tree: Path, batch_size: int, rungs: list[str], extra: list[str]) -> dict:
    """The ladder's results dict for ``rungs`` at ``batch_size``, run from checkout ``tree``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ladder.json"
        cmd = [
            sys.executable,
            "-m",
            "helpers.ladder",
            "--batch-size",
            str(batch_size),
            "--rungs",
            *rungs,
            "--out",
            str(out),
            "--no-progress",
            *extra,
        ]
        path = os.pathsep.join([str(tree.resolve()), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path}
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{tree}: {' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, required=True, help="checkout before the change")
    p.add_argument("--new", type=Path, required=True, help="checkout after the change")
    p.add_argument("--batch-size", type=int, nargs="+", default=[16, 64])
    p.add_argument("--rungs", nargs="+", required=True)
    p.add_argument("--rounds", type=int, default=2)
    results.add_out(p, required=True)
    args, extra = p.parse_known_args(argv)
    args.out = results.checked_out(p, args.out, args.force)
    runs = []
    for r in range(args.rounds):
        for B in args.batch_size:
            order = [("old", args.old), ("new", args.new)]
            for which, tree in order if r % 2 == 0 else order[::-1]:
                res = ladder_rows(tree, B, args.rungs, extra)
                runs.append({"round": r, "which": which, "batch_size": B, "results": res})
                for row in res["rungs"]:
                    print(
                        f"round {r} {which:<3} B={B:<3} {row['name']:<22} "
                        f"{row['status']:<9} {row['ms_per_step'] or 0:8.2f} ms",
                        flush=True,
                    )
    summary = []
    for B in args.batch_size:
        names = [row["name"] for row in runs[0]["results"]["rungs"]]
        for name in names:
            ms = {
                w: [
                    row["ms_per_step"]
                    for run in runs
                    if run["which"] == w and run["batch_size"] == B
                    for row in run["results"]["rungs"]
                    if row["name"] == name and row["status"] == "measured"
                ]
                for w in ("old", "new")
            }
            if ms["old"] and ms["new"]:
                old, new = statistics.median(ms["old"]), statistics.median(ms["new"])
                summary.append(
                    {
                        "batch_size": B,
                        "rung": name,
                        "old_ms": ms["old"],
                        "new_ms": ms["new"],
                        "ratio_new_over_old": new / old,
                    }
                )
                print(
                    f"B={B:<3} {name:<22} old {old:8.2f} ms  new {new:8.2f} ms  "
                    f"new/old {new / old:.3f}",
                    flush=True,
                )
    meta = runs[0]["results"] if runs else {}
    out = {k: meta.get(k) for k in ("device", "torch", "cuda", "date")}
    out.update(old=str(args.old), new=str(args.new), rounds=args.rounds, summary=summary, runs=runs)
    results.save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
