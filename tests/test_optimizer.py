"""DeepHyper is built and told results lazily: nothing before it is first asked, then one
surrogate refit per ask, not per trial."""

import subprocess
import sys
from pathlib import Path

import numpy as np

from parsearch.search.candidates import point_of
from parsearch.search.optimizer import BayesianOptimizer
from parsearch.search.strategy import GuidedStrategy
from parsearch.search.surrogate import EstimateSurrogate
from parsearch.space import load_space

SPACE = Path(__file__).parent.parent / "search_spaces" / "gpt-22b-frontier.yaml"

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
from parsearch.search.candidates import point_of
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


def test_deephyper_learns_what_the_estimate_gets_wrong_in_the_estimates_frame():
    """The default strategy's DeepHyper is told log objectives and fits a surrogate that
    is the calibrated estimate plus the residual field: where it was told, it predicts what
    was measured; where nothing was measured, the estimate; and it is the same model the
    strategy's ranking reads."""
    space = load_space(SPACE)
    strategy = GuidedStrategy(space, seed=0, n_seeds=1)
    try:
        told = strategy.ask(4)
        objective = strategy.estimate.objective()
        index = strategy.estimate.index
        results = [(p.layout, 1.3 * objective[index[p.layout.key()]]) for p in told]
        strategy.tell(results)
        asked = strategy.optimizer.ask(1)
        assert asked and strategy.space.layout_from_point(asked[0]) is not None
        search = strategy.optimizer._cbo()
        model = search._opt.models[-1]
        assert isinstance(model, EstimateSurrogate)
        calibrated = strategy.estimate.objective()
        mean, spread = strategy.residual.posterior(calibrated)
        names = search._opt_space.dimension_names
        points = [
            strategy.optimizer._encode(point_of(space, c.layout)) for c in strategy.estimate.items
        ]
        rows = search._opt_space.transform([[point[n] for n in names] for point in points])
        predicted, error = model.predict(np.asarray(rows), return_std=True)
        assert np.allclose(-predicted, np.log(calibrated) + mean)
        assert np.allclose(error, spread)
        measured = [index[p.layout.key()] for p in told]
        assert np.allclose(
            mean[measured],
            np.log(1.3 * objective[measured] / calibrated[measured]),
            atol=0.05,
        )
        far = spread > 0.19
        assert far.any() and np.abs(mean[far]).max() < 0.02
    finally:
        strategy.close()
