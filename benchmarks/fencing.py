"""Cost of fencing every store write by the lease generation.

A driver that holds a campaign's lease checks, inside each write transaction, that the lease
still carries its owner and generation: one primary-key SELECT next to a write that fsyncs.
This measures add_trial + mark_running + finish_trial per trial with and without a held
lease, on the same disk, interleaved in rounds so that disk noise hits both alike.

    .venv/bin/python benchmarks/fencing.py [--trials 200] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from parsearch.config import ParallelLayout
from parsearch.result import TrialResult, TrialState
from parsearch.store import open_store

RESULT = TrialResult(TrialState.OK, {"tokens_per_s": 1.0})


def per_trial_ms(path: Path, trials: int, *, fenced: bool) -> float:
    with open_store(path) as store:
        campaign = store.create_campaign(path.stem, {})
        if fenced:
            store.acquire_lease(campaign.id, "bench", stale_after_s=60.0)
        began = time.perf_counter()
        for gas in range(1, trials + 1):
            trial = store.add_trial(campaign.id, ParallelLayout(1, 1, 1, 1, gas))
            store.mark_running(trial.id, ["n0"], attempt=1)
            store.finish_trial(trial.id, RESULT, 1.0)
        return (time.perf_counter() - began) / trials * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    plain, fenced = [], []
    with tempfile.TemporaryDirectory(dir=".") as work:
        for round_ in range(args.rounds):
            order = (False, True) if round_ % 2 == 0 else (True, False)  # no order bias
            for is_fenced in order:
                path = Path(work, f"{'fenced' if is_fenced else 'plain'}{round_}.db")
                ms = per_trial_ms(path, args.trials, fenced=is_fenced)
                (fenced if is_fenced else plain).append(ms)
    p, f = statistics.median(plain), statistics.median(fenced)
    print(f"ms per trial (3 fsynced writes), median of {args.rounds} rounds x {args.trials}:")
    print(f"  without a lease: {p:.2f}   fenced: {f:.2f}   ratio fenced/plain: {f / p:.3f}")


if __name__ == "__main__":
    main()
