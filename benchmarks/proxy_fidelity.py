"""How well a proxy trial predicts its full-scale figures, on real gloo ranks.

The tiny GPT of ``search_spaces/tiny-cpu.yaml`` (built-in trainer, fp32 on CPU, its one node
of 4 ranks): each layout runs at full scale (dp = 2 and 4) and as every proxy of it (dp'
dividing dp, at least 2 under ZeRO), plain DDP (zero_stage 0) and FSDP2 (zero_stage 1 and 3,
whose optimizer state, and at 3 the weights, shard over dp).
For each proxy: full-scale tokens/s and peak memory predicted by
:func:`parsearch.estimate.proxy.full_scale_figures` against the full-scale measurement, next to
the naive baseline (tokens/s x dp/dp', memory as measured) from the same runs.

On a 2-core machine 4 ranks share 2 cores: the full-scale dp=4 runs are slowed by the
oversubscription, which no DP model predicts; read the dp=2 rows for the correction itself.

    .venv/bin/python benchmarks/proxy_fidelity.py [--steps 6] [--repeat 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from parsearch.config import ParallelLayout
from parsearch.estimate.proxy import ProxyPlan, full_scale_figures, proxy_dps
from parsearch.result import TrialResult
from parsearch.space import load_space
from parsearch.trainers.builtin import run_trial
from parsearch.trial import TrialSpec

ROOT = Path(__file__).resolve().parent.parent


def measure(space, layout: ParallelLayout, steps: int, repeat: int) -> dict[str, float]:
    """Median tokens/s and peak memory over ``repeat`` runs of ``layout``."""
    runs: list[TrialResult] = []
    for attempt in range(repeat):
        spec = TrialSpec(
            trial_id=f"proxy-{layout.key()}-{attempt}",
            model=space.model,
            layout=layout,
            allocation=space.allocation,
            trainer={"kind": "builtin", "steps": steps, "warmup_steps": 2},
            timeout_s=600,
        )
        with tempfile.TemporaryDirectory() as directory:
            result = run_trial(spec, Path(directory))
        if not result.ok:
            raise SystemExit(f"{layout.short()}: {result.status.value}: {result.error}")
        runs.append(result)
    return {
        name: statistics.median(float(r.metrics[name]) for r in runs)
        for name in ("tokens_per_s", "step_time_s", "peak_mem_bytes", "tflops_per_device")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    space = load_space(ROOT / "search_spaces" / "tiny-cpu.yaml")
    print(
        f"{'layout':<28} {'proxy':>5} {'tok/s meas.':>11} {'pred.':>9} {'err':>7} "
        f"{'naive err':>9} {'mem meas.':>10} {'pred.':>9} {'err':>7} {'naive err':>9}"
    )
    errors: dict[str, list[float]] = {"tokens": [], "naive tokens": [], "mem": [], "naive mem": []}
    for zero_stage in (0, 1, 3):
        for dp in (2, 4):
            full = ParallelLayout(tp=1, pp=1, dp=dp, mbs=2, gas=2, zero_stage=zero_stage)
            truth = measure(space, full, args.steps, args.repeat)
            for proxy_dp in proxy_dps(full):
                plan = ProxyPlan(full, proxy_dp, nodes=1)
                measured = measure(space, plan.proxy_layout, args.steps, args.repeat)
                predicted = full_scale_figures(
                    space.model, plan, measured, space.allocation, space.estimate
                )
                naive_tokens = measured["tokens_per_s"] * dp / proxy_dp
                row = {
                    "tokens": predicted["tokens_per_s"] / truth["tokens_per_s"] - 1,
                    "naive tokens": naive_tokens / truth["tokens_per_s"] - 1,
                    "mem": predicted["peak_mem_bytes"] / truth["peak_mem_bytes"] - 1,
                    "naive mem": measured["peak_mem_bytes"] / truth["peak_mem_bytes"] - 1,
                }
                for name, value in row.items():
                    errors[name].append(abs(value))
                print(
                    f"{full.short():<28} {proxy_dp:>5} {truth['tokens_per_s']:>11.0f} "
                    f"{predicted['tokens_per_s']:>9.0f} {row['tokens']:>+7.1%} "
                    f"{row['naive tokens']:>+9.1%} {truth['peak_mem_bytes'] / 2**20:>8.2f}Mi "
                    f"{predicted['peak_mem_bytes'] / 2**20:>7.2f}Mi {row['mem']:>+7.1%} "
                    f"{row['naive mem']:>+9.1%}"
                )
    print(
        "median |error|: tokens/s {:.1%} (naive {:.1%}); peak memory {:.1%} (naive {:.1%})".format(
            *(statistics.median(errors[name]) for name in errors)
        )
    )


if __name__ == "__main__":
    main()
