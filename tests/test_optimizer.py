"""DeepHyper is built and told results lazily: nothing before it is first asked, then one
surrogate refit per ask, not per trial."""

import subprocess
import sys

from parsearch.search.optimizer import BayesianOptimizer

DIMENSIONS = {"tp": (1, 2, 4), "pp": (1, 2), "mbs": (1, 2, 4, 8)}


def test_results_reach_deephyper_at_its_next_ask_in_one_batch():
    optimizer = BayesianOptimizer(DIMENSIONS, seed=0, n_initial_points=2)
    batches = []
    search = optimizer._cbo()
    real_tell = search.tell

    def counting_tell(results):
        batches.append(len(results))
        return real_tell(results)

    search.tell = counting_tell
    try:
        points = optimizer.ask(3)
        for number, point in enumerate(points):
            optimizer.tell([(point, float(number + 1))])
        assert batches == [], "nothing is refit before DeepHyper is asked again"
        assert len(optimizer.ask(1)) == 1
        assert batches == [3]
        optimizer.ask(1)
        assert batches == [3], "no empty tells"
    finally:
        optimizer.close()


LAZY = """
import sys
from parsearch.search.optimizer import BayesianOptimizer
optimizer = BayesianOptimizer({"tp": (1, 2), "mbs": (1, 2)}, seed=0, allowed=[{"tp": 1, "mbs": 2}])
optimizer.tell([({"tp": 1, "mbs": 1}, 1.0)])
optimizer.restrict([{"tp": 2, "mbs": 2}])
print("deephyper" in sys.modules)
print(optimizer.ask(1), "deephyper" in sys.modules)
optimizer.close()
"""


def test_deephyper_is_imported_only_when_first_asked():
    """Its import takes seconds of every driver's start-up otherwise: a campaign whose
    trials all come from the estimate never pays it."""
    done = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False", "[{'tp': 2, 'mbs': 2}] True"]
