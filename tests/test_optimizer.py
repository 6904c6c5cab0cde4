"""DeepHyper is told results lazily: one surrogate refit per ask, not per trial."""

from parsearch.search.optimizer import BayesianOptimizer

DIMENSIONS = {"tp": (1, 2, 4), "pp": (1, 2), "mbs": (1, 2, 4, 8)}


def test_results_reach_deephyper_at_its_next_ask_in_one_batch():
    optimizer = BayesianOptimizer(DIMENSIONS, seed=0, n_initial_points=2)
    batches = []
    real_tell = optimizer._search.tell

    def counting_tell(results):
        batches.append(len(results))
        return real_tell(results)

    optimizer._search.tell = counting_tell
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
