"""The ``field-kernel`` variant of benchmarks/search_efficiency.py: the residual field given
the random-field truth's own kernel, the bound its README reports. Its coordinates must put
two layouts one value apart in a searched dimension exactly that dimension's drawn
correlation length apart, and layouts that differ in no searched dimension together."""

from pathlib import Path

import numpy as np
import pytest
from search_efficiency import field_kernel_coordinates
from truths import RandomField

from parsearch.search.residual import kernel
from parsearch.search.strategy import GuidedStrategy
from parsearch.space import load_space

ROOT = Path(__file__).resolve().parents[1]


def test_the_bound_gives_the_residual_field_the_truths_own_kernel():
    space = load_space(ROOT / "search_spaces" / "llama3-8b-h200.yaml")
    strategy = GuidedStrategy(space, seed=3)
    try:
        coordinates = field_kernel_coordinates(space, 3, strategy)
        truth = RandomField(space, 3)
        layouts = [c.layout for c in strategy.estimate.items]

        def point(layout, **change):
            return tuple(change.get(n, getattr(layout, n)) for n in truth.names)

        # In this space the searched values fix a layout (dp and gas are derived).
        where = {point(layout): i for i, layout in enumerate(layouts)}
        assert len(where) == len(layouts)
        checked = 0
        for d, name in enumerate(truth.names):
            values = space.searched[name]
            for i, layout in enumerate(layouts):
                step = values.index(getattr(layout, name)) + 1
                if step == len(values):
                    continue
                other = where.get(point(layout, **{name: values[step]}))
                if other is None:
                    continue
                distance = np.linalg.norm(coordinates[i] - coordinates[other])
                assert distance == pytest.approx(1.0 / truth.lengths[d])
                correlation = kernel(coordinates[i : i + 1], coordinates[other : other + 1])
                assert correlation[0, 0] == pytest.approx(np.exp(-0.5 / truth.lengths[d] ** 2))
                checked += 1
                break
        assert checked == len(truth.names)
    finally:
        strategy.close()
