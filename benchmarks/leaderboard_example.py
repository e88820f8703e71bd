"""Write the class leaderboard's committed example (results/leaderboard-example.csv and .png).

    python benchmarks/leaderboard_example.py --out-dir results [--force]

Four learners: three measured ladders (the course's two H200 ladders, results/h200-ladder-b16.json
and h200-ladder-b64.json, and a CPU ladder of the small configuration,
results/cpu-ladder-2026-12-01.json, measured on a 2-core Xeon), and one MADE-UP submission, named
as such:

- ``fake-learner-b``: the B=16 ladder 10% faster with the last rung's tokens/s tripled, which the
  leaderboard refuses (tokens/s is not B*T/(ms/1000)).

Only the refused fake is made up; the example shows what ``python -m helpers.grading leaderboard``
writes.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

from helpers.grading import leaderboard
from helpers.grading.grader import main as grading_main
from helpers.measure import results


def scaled(record: dict, factor: float) -> dict:
    """``record`` with every measured rung ``factor`` times slower, tokens/s and speed-ups
    recomputed (a made-up ladder that stays consistent)."""
    out = copy.deepcopy(record)
    measured = [r for r in out["rungs"] if r["status"] == "measured"]
    for r in measured:
        r["ms_per_step"] *= factor
        r["tokens_per_s"] /= factor
        r["speedup"] = measured[0]["ms_per_step"] / r["ms_per_step"]
    return out


def fake_learners(b16: dict) -> dict[str, dict]:
    """The made-up submission described at the top of this file."""
    b = scaled(b16, 0.9)
    b["rungs"][-1]["tokens_per_s"] *= 3
    return {"fake-learner-b": b}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", type=Path, default=Path("results"))
    p.add_argument("--force", action="store_true", help="replace an earlier example")
    args = p.parse_args(argv)
    files = {f"course-h200-b{b}": f"h200-ladder-b{b}.json" for b in (16, 64)}
    files["course-cpu"] = "cpu-ladder-2026-12-01.json"
    learners = {name: results.load(file) for name, file in files.items()}
    missing = [file for name, file in files.items() if learners[name] is None]
    if missing:
        print(f"error: {results.missing(missing[0])}", file=sys.stderr)
        return 2
    learners |= fake_learners(learners["course-h200-b16"])
    with tempfile.TemporaryDirectory() as tmp:
        for student, record in learners.items():
            (Path(tmp) / student).mkdir()
            leaderboard.save(record, Path(tmp) / student / leaderboard.SUBMISSION_FILE)
        out = args.out_dir / "leaderboard-example"
        command = ["leaderboard", tmp, "--csv", f"{out}.csv", "--png", f"{out}.png"]
        return grading_main(command + ["--force"] * args.force)


if __name__ == "__main__":
    sys.exit(main())
