"""The proxy truths of ``benchmarks/proxy_truths.py`` hold to their definitions: on
``dp-skew`` a proxy's full-scale prediction misses by a factor that differs by layout (not
one a global correction could learn), on ``dp-wall`` the fastest layouts run out of memory
at full scale where their proxies fit, which no proxy can show."""

import math
from pathlib import Path

import pytest
from proxy_truths import DPSkew, DPWall
from truths import RandomField

from parsearch.estimate.proxy import choose_proxy, full_scale_figures
from parsearch.space import load_space

SPACE = Path(__file__).parent.parent / "search_spaces" / "gpt-22b-frontier.yaml"


def proxy_misses(truth) -> list[float]:
    """log(full-scale measured / predicted from the proxy), noiseless, over the estimate's
    40 best layouts that a proxy measures and that fit both ways."""
    space = truth.space
    ranked = sorted(space.plan().feasible, key=lambda item: -item[1].tokens_per_s)[:40]
    misses = []
    for layout, _ in ranked:
        plan = choose_proxy(space.model, layout, space.allocation, space.estimate)
        if plan is None:
            continue
        proxy = truth.measure(plan.proxy_layout, noisy=False)
        full = truth.measure(layout, noisy=False)
        if proxy.ok and full.ok:
            figures = full_scale_figures(
                space.model, plan, proxy.metrics, space.allocation, space.estimate
            )
            misses.append(math.log(full.metrics["tokens_per_s"] / figures["tokens_per_s"]))
    return misses


def test_on_dp_skew_the_proxy_miss_differs_by_layout():
    space = load_space(SPACE)
    field = proxy_misses(RandomField(space, seed=0))
    skew = proxy_misses(DPSkew(space, seed=0))
    assert len(skew) >= 20
    assert max(field) - min(field) < 0.02  # the field truth: the estimate's DP delta, exact
    assert max(skew) <= 0.01  # a proxy sees less of the reduction: it predicts high
    assert max(skew) - min(skew) > 0.08  # by how much is the layout's own


@pytest.mark.parametrize("seed", [0, 1])
def test_on_dp_wall_the_fastest_run_out_of_memory_at_full_scale_only(seed):
    space = load_space(SPACE)
    truth = DPWall(space, seed=seed)
    raised = [key for key, wall in truth.walls.items() if wall > DPWall.WALL]
    assert len(raised) == DPWall.RAISED
    for layout, _ in space.plan().feasible:
        if layout.key() in raised:
            plan = choose_proxy(space.model, layout, space.allocation, space.estimate)
            assert plan is not None
            assert truth.measure(plan.proxy_layout, noisy=False).ok
            assert not truth.measure(layout, noisy=False).ok
