"""Loss check of the issue "beat the reference trainer": the fastest configuration must train like
the plain bf16 one.

    python benchmarks/loss_check.py --steps 200 --batch-size 16 --variants final \\
        --seeds 1337 1 2 --out results/x.json

For each seed in ``--seeds`` (the seed of the initial weights; one run per seed), trains GPT-2 124M
(T=1024) on Tiny Shakespeare for ``--steps`` steps from that seed and the same batches with (a) the
ladder's "+ bf16 autocast" rung (TF32 + bf16 autocast, eager, manual attention, vocab 50257,
foreach AdamW) and (b) the ladder's last rung plus each ``benchmarks/perf.py`` variant, then
compares the mean loss of the last 10 steps. Passing means every variant within ``--tolerance``
(1%) of the plain rung of the same seed, in every run.

``--repeats N`` runs each variant N times per seed (the plain rung, eager, repeats its losses to
4 decimals; the compiled last rung does not: its kernels are not deterministic, and 200 steps
carry their differences to the loss, by 2-3% on some seeds, results/perf-log.md). The JSON's
``summary`` then gives, per seed and variant, the repeats' mean, lowest and highest, whether the
mean is within the tolerance, whether the plain rung's value lies inside the repeats' range
(a difference no larger than the variant's own run-to-run spread), and ``step_diff`` (how far the
repeats' curves are apart step by step: see :func:`step_diff`), which tells a variant that trains
less repeatably from one whose last-10 means differ by chance. ``passed`` stays the issue's
verdict: every run within the tolerance.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from helpers.core import data
from helpers.core.model import GPTConfig
from helpers.core.train import build, unsupported_reason
from helpers.ladder import ladder_configs, last_runnable
from helpers.measure import results

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from perf import experiment, switches  # noqa: E402
from perf import variant as variant_name  # noqa: E402


def run_losses(
    run, steps: int, tokens: torch.Tensor, device: torch.device, variant: str = "final"
) -> list[float]:
    with experiment(variant):  # around the build too: a patch may be read when the model is made
        trainer = build(run, GPTConfig(), device)
        loader = data.BatchLoader(tokens, run.batch_size, run.seq_len, device)
        losses = [trainer.step(loader) for _ in range(steps)]
    return [float(x) for x in torch.stack(losses).cpu()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--variants", nargs="+", default=["final"], type=variant_name)
    p.add_argument("--tolerance", type=float, default=0.01)
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="one run per seed of the initial weights (default: the RunConfig's seed only)",
    )
    p.add_argument(
        "--repeats", type=int, default=1, help="runs of each variant per seed (default 1)"
    )
    results.add_out(p)
    args = p.parse_args(argv)
    args.out = results.checked_out(p, args.out, args.force)
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    if not torch.cuda.is_available():
        print("benchmarks/loss_check.py needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    tokens = data.load_tokens()
    rungs = {run.name: run for run, _ in ladder_configs(args.batch_size, 1024, device=device)}
    plain = rungs["+ bf16 autocast"]
    final = last_runnable(args.batch_size, 1024, device)
    seeds = args.seeds or [plain.seed]
    rows, summary, ok = [], [], True
    for seed in seeds:
        seeded = plain.replace(seed=seed)
        base = run_losses(seeded, args.steps, tokens, device)
        base_end = sum(base[-10:]) / 10
        rows.append(
            {
                "config": "plain bf16 (ladder rung '+ bf16 autocast')",
                "seed": seed,
                "switches": dataclasses.asdict(seeded),
                "last10_mean_loss": base_end,
                "losses": base,
            }
        )
        print(
            f"seed {seed}, plain bf16: loss(last 10 of {args.steps}) = {base_end:.4f}", flush=True
        )
        for v in args.variants:
            run = final.replace(name=v, seed=seed, **switches(v))
            reason = unsupported_reason(run, device)
            if reason is not None:  # e.g. pytorch-ce on the fp8 LM head: skipped, not a crash
                print(f"seed {seed}, {v}: skipped: {reason}", flush=True)
                rows.append(
                    {"config": f"last rung ({final.name}) + {v}", "seed": seed, "skipped": reason}
                )
                continue
            ends, curves = [], []
            for repeat in range(args.repeats):
                losses = run_losses(run, args.steps, tokens, device, v)
                curves.append(losses)
                end = sum(losses[-10:]) / 10
                rel = (end - base_end) / base_end
                ok &= abs(rel) <= args.tolerance
                ends.append(end)
                rows.append(
                    {
                        "config": f"last rung ({final.name}) + {v}",
                        "seed": seed,
                        "repeat": repeat,
                        "switches": dataclasses.asdict(run),
                        "last10_mean_loss": end,
                        "rel_diff": rel,
                        "losses": losses,
                    }
                )
                print(
                    f"seed {seed}, {v}, run {repeat + 1}: loss(last 10) = {end:.4f}  "
                    f"({100 * rel:+.2f}% vs plain bf16)",
                    flush=True,
                )
                # a later crash keeps what ran; the verdict is written once every pair has run
                write(args.out, args, seeds, None, rows, device, summary)
            summary.append(repeats_summary(seed, v, base_end, ends, args.tolerance, curves))
            if summary[-1]["step_diff"] is not None:
                print(
                    f"seed {seed}, {v}: runs apart by {summary[-1]['step_diff']:.4f} per step "
                    f"(mean |loss difference| over the second half, all pairs of runs)",
                    flush=True,
                )
    write(args.out, args, seeds, ok, rows, device, summary)
    return 0 if ok else 1


def step_diff(curves: list[list[float]]) -> float | None:
    """How far repeated runs' loss curves are apart: the mean over all pairs of runs of the mean
    absolute difference of their losses (nats) over the second half of the steps, where the
    compiled step's nondeterminism has had time to grow. None with fewer than two runs.

    Raises:
        ValueError: curves of different lengths.
    """
    if len({len(c) for c in curves}) > 1:
        raise ValueError(f"curves of different lengths {[len(c) for c in curves]}")
    if len(curves) < 2:
        return None
    half = len(curves[0]) // 2
    pairs = [(a, b) for i, a in enumerate(curves) for b in curves[i + 1 :]]
    return sum(
        sum(abs(x - y) for x, y in zip(a[half:], b[half:], strict=True)) / (len(a) - half)
        for a, b in pairs
    ) / len(pairs)


def repeats_summary(
    seed: int,
    variant: str,
    plain: float,
    ends: list[float],
    tol: float,
    curves: list[list[float]],
) -> dict:
    """One seed's runs of ``variant`` against the plain rung's ``plain`` loss: the mean, lowest
    and highest of ``ends`` (each run's mean loss over its last 10 steps), the mean's relative
    difference and whether it is within ``tol``, whether ``plain`` lies inside [lowest, highest]
    (then the difference is no larger than the variant's own run-to-run spread), and
    ``step_diff`` of the runs' loss ``curves`` (None with one run)."""
    mean = sum(ends) / len(ends)
    return {
        "seed": seed,
        "variant": variant,
        "runs": len(ends),
        "plain": plain,
        "mean": mean,
        "lowest": min(ends),
        "highest": max(ends),
        "mean_rel_diff": (mean - plain) / plain,
        "mean_within_tolerance": abs(mean - plain) <= tol * plain,
        "plain_inside_range": min(ends) <= plain <= max(ends),
        "step_diff": step_diff(curves),
    }


def write(path, args, seeds, ok, rows, device, summary=()) -> None:
    """Write the check's JSON to ``path`` (nothing when ``path`` is None); ``passed`` is None
    while pairs are still to run."""
    if path is None:
        return
    out = {
        **results.provenance(device),
        "batch_size": args.batch_size,
        "seq_len": 1024,
        "steps": args.steps,
        "tolerance": args.tolerance,
        "seeds": seeds,
        "repeats": args.repeats,
        "passed": ok,
        "summary": list(summary),
        "rows": rows,
    }
    results.save(out, path, say=ok is not None)


if __name__ == "__main__":
    raise SystemExit(main())
