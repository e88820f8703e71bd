"""Write the class leaderboard's committed example (results/leaderboard-example.csv and .png).

    python benchmarks/leaderboard_example.py --out-dir results [--force]

Four learners: the course's two H200 ladders as measured (results/h200-ladder-b16.json and
h200-ladder-b64.json), and two MADE-UP ones, named as such:

- ``fake-learner-a``: the B=16 ladder relabelled as an A100 80GB, every rung 2.5 times slower and
  the fp8 rung skipped (an A100 has no fp8 tensor cores), so a second GPU model appears;
- ``fake-learner-b``: the B=16 ladder 10% faster with the last rung's tokens/s tripled, which the
  leaderboard refuses (tokens/s is not B*T/(ms/1000)).

Nothing here is measured: it shows what ``python -m helpers.grading leaderboard`` writes.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

from helpers.grading import leaderboard
from helpers.grading.grader import main as grading_main
from helpers.measure import gpus, results


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
    """The two made-up submissions described at the top of this file."""
    a = scaled(b16, 2.5)
    a["device"] = "NVIDIA A100-SXM4-80GB"
    peak = gpus.PROFILES["A100-80GB"].peak_tensor_tflops * 1e12
    for r in a["rungs"]:
        r["mfu"] = a["config"]["flops_per_token"] * r["tokens_per_s"] / peak
        if r["switches"]["lm_head_fp8"]:
            r.update(status="skipped", ms_per_step=None, tokens_per_s=None, speedup=None, mfu=None)
            r["reason"] = "made up: fp8 tensor cores need compute capability >= 8.9"
    b = scaled(b16, 0.9)
    b["rungs"][-1]["tokens_per_s"] *= 3
    return {"fake-learner-a": a, "fake-learner-b": b}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", type=Path, default=Path("results"))
    p.add_argument("--force", action="store_true", help="replace an earlier example")
    args = p.parse_args(argv)
    learners = {f"course-h200-b{b}": results.load(f"h200-ladder-b{b}.json") for b in (16, 64)}
    if None in learners.values():
        print(f"error: {results.missing('h200-ladder-b16.json')}", file=sys.stderr)
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
