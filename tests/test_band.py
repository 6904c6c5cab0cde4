"""The band (issue 38, item 2): a profile's stated ranges, the arithmetic that scales its
figures, the corners bracketing every point of the box, and each shipped profile's ranges
containing what its own sources measured."""

import copy
import dataclasses
import random
from pathlib import Path

import pytest

from parsearch.config import AllocationSpec
from parsearch.errors import SpaceError
from parsearch.estimate.band import (
    corner,
    predict_band,
    predict_scaled,
    scaled_allocation,
    scaled_settings,
)
from parsearch.estimate.machine import (
    UNCERTAIN_FIGURES,
    CollectiveFit,
    FigureUncertainty,
    GemmPoint,
    MachineProfile,
)
from parsearch.estimate.memory import EstimateSettings
from parsearch.estimate.profile import profile_from_dict, profile_to_dict
from parsearch.estimate.timing import collective_s
from parsearch.profiles import load_profile, shipped
from parsearch.space import load_space

ROOT = Path(__file__).parent.parent
FRONTIER = [ROOT / "search_spaces" / f"gpt-{size}-frontier.yaml" for size in ("22b", "175b", "1t")]


def _profile(**changes) -> MachineProfile:
    base = MachineProfile(
        name="hand",
        nodes=None,
        devices_per_node=8,
        precision="bf16",
        peak_flops_per_device=100e12,
        gemm=(GemmPoint(tp=1, mbs=1, seq=128, efficiency=0.5),),
        collectives=(
            CollectiveFit("tp-intra-node", "all-reduce", 2, alpha_s=10e-6, beta_s_per_byte=1e-11),
            CollectiveFit("dp-across-nodes", "all-reduce", 2, 20e-6, 8e-11),
            CollectiveFit("pp-p2p", "send-recv", 2, 20e-6, 8e-11),
        ),
        attention_flops=40e12,
        memory_bandwidth_bytes_per_s=1e12,
    )
    return dataclasses.replace(base, **changes)


def _range(figure, low, high, basis="assumption", measured=()):
    return FigureUncertainty(figure, low, high, basis, "stated by hand", tuple(measured))


def test_the_slow_corner_takes_rates_low_and_latencies_high():
    profile = _profile(
        uncertainty=(_range("gemm", 0.8, 1.0), _range("collective_latency", 0.5, 3.0))
    )
    assert corner(profile, "slow") == {"gemm": 0.8, "collective_latency": 3.0}
    assert corner(profile, "fast") == {"gemm": 1.0, "collective_latency": 0.5}
    with pytest.raises(ValueError):
        corner(profile, "middle")


def test_scaled_settings_by_hand():
    """Each factor lands on its own figures: the GEMM cap and probed points (capped at 1),
    attention (capped at the peak), memory bandwidth, latencies of every fit, and the
    bandwidth of node-link fits apart from the network's."""
    settings = EstimateSettings(compute_efficiency=0.7, machine=_profile())
    factors = {
        "gemm": 1.5,
        "attention": 3.0,
        "memory_bandwidth": 0.7,
        "collective_latency": 2.0,
        "node_links": 0.5,
        "network": 0.25,
    }
    scaled = scaled_settings(settings, factors)
    machine = scaled.machine
    assert scaled.compute_efficiency == 1.0  # 0.7 x 1.5, capped
    assert machine.gemm[0].efficiency == pytest.approx(0.75)
    assert machine.attention_flops == 100e12  # 120e12, capped at the peak
    assert machine.memory_bandwidth_bytes_per_s == pytest.approx(0.7e12)
    assert scaled.collective_latency_s == pytest.approx(2 * settings.collective_latency_s)
    intra, across, p2p = machine.collectives
    assert (intra.alpha_s, intra.beta_s_per_byte) == pytest.approx((20e-6, 2e-11))
    assert (across.alpha_s, across.beta_s_per_byte) == pytest.approx((40e-6, 32e-11))
    assert (p2p.alpha_s, p2p.beta_s_per_byte) == pytest.approx((40e-6, 32e-11))
    # One all-reduce of 1 GB over 2 ranks inside a node: 2 x 10 us + 1e9 x 2e-11 s.
    assert collective_s("all-reduce", 1e9, 2, "tp-intra-node", 1e11, scaled) == pytest.approx(
        2e-5 + 2e-2
    )
    allocation = scaled_allocation(
        AllocationSpec(
            name="a",
            nodes=2,
            devices_per_node=8,
            device_memory_bytes=64 << 30,
            peak_flops_per_device=100e12,
        ),
        factors,
    )
    assert allocation.intra_node_bandwidth_bytes_per_s == pytest.approx(50e9)
    assert allocation.inter_node_bandwidth_bytes_per_s == pytest.approx(25e9 / 4)
    assert allocation.peak_flops_per_device == 100e12  # MFU keeps its denominator


def test_no_stated_uncertainty_no_band():
    space = load_space(FRONTIER[1])
    layout, _ = space.plan().feasible[0]
    plain = dataclasses.replace(
        space.estimate, machine=dataclasses.replace(space.estimate.machine, uncertainty=())
    )
    assert predict_band(space.model, layout, space.allocation, plain) is None
    assert predict_band(space.model, layout, space.allocation, EstimateSettings()) is None


@pytest.mark.parametrize("path", FRONTIER, ids=lambda p: p.stem)
def test_every_point_of_the_box_lies_between_the_corners(path):
    """The corners are the lowest and highest throughput over the box of stated ranges
    (the step time is monotone in each figure): random interior points of the box, on the
    space's five best layouts, never leave the band."""
    space = load_space(path)
    profile = space.estimate.machine
    rng = random.Random(38)
    for layout, prediction in space.plan().feasible[:5]:
        band = predict_band(space.model, layout, space.allocation, space.estimate, space.schedule)
        assert band.tokens_per_s_low <= prediction.tokens_per_s <= band.tokens_per_s_high
        assert band.mfu_low <= prediction.mfu <= band.mfu_high
        for _ in range(20):
            factors = {
                item.figure: rng.uniform(item.low, item.high) for item in profile.uncertainty
            }
            inside = predict_scaled(
                space.model, layout, space.allocation, space.estimate, factors, space.schedule
            )
            assert band.tokens_per_s_low * (1 - 1e-9) <= inside.tokens_per_s
            assert inside.tokens_per_s <= band.tokens_per_s_high * (1 + 1e-9)


def _nominal(profile: MachineProfile, figure: str) -> float:
    """A figure as the profile writes it, in the unit its ``measured`` values use."""
    if figure == "gemm":
        return max(shape.tflops for shape in profile.gemm_shapes)
    if figure == "attention":
        return profile.attention_flops / 1e12
    if figure == "memory_bandwidth":
        return profile.memory_bandwidth_bytes_per_s / 1e9
    raise AssertionError(f"{profile.name}: no single written value for {figure}'s measurements")


@pytest.mark.parametrize("name", sorted(shipped()))
def test_each_shipped_range_contains_what_its_sources_measured(name):
    profile = load_profile(name)
    for item in profile.uncertainty:
        assert item.figure in UNCERTAIN_FIGURES and item.reason
        nominal = _nominal(profile, item.figure) if item.measured else None
        for value in item.measured:
            assert nominal * item.low * (1 - 1e-9) <= value <= nominal * item.high * (1 + 1e-9), (
                f"{name}: {item.figure} measured {value} outside "
                f"[{nominal * item.low:g}, {nominal * item.high:g}]"
            )


def test_the_frontier_profile_states_which_figures_are_assumptions():
    profile = load_profile("mi250x-frontier")
    bases = {item.figure: item.basis for item in profile.uncertainty}
    assert bases["collective_latency"] == "assumption"
    assert bases["gemm"] == "single point"
    gemm = next(item for item in profile.uncertainty if item.figure == "gemm")
    assert 127.0 in gemm.measured  # the second setup's MAMF (ml-engineering issue 76)


def test_the_uncertainty_section_reads_back_as_written():
    data = profile_to_dict(load_profile("mi250x-frontier"))
    again = profile_from_dict(copy.deepcopy(data), source="again.yaml")
    assert again.uncertainty == load_profile("mi250x-frontier").uncertainty


@pytest.mark.parametrize(
    "entry, field",
    [
        ({"low": 1.2, "high": 1.5, "basis": "assumption", "reason": "r"}, "uncertainty.gemm.low"),
        ({"low": 0.5, "high": 1.0, "basis": "a guess", "reason": "r"}, "uncertainty.gemm.basis"),
        ({"low": 0.5, "high": 1.0, "basis": "assumption"}, "uncertainty.gemm.reason"),
        (
            {"low": 0.5, "high": 1.0, "basis": "assumption", "reason": "r", "measured": ["x"]},
            "uncertainty.gemm.measured[0]",
        ),
    ],
)
def test_a_bad_range_names_its_field(entry, field):
    data = profile_to_dict(load_profile("mi250x-frontier"))
    data["uncertainty"] = {"gemm": entry}
    with pytest.raises(SpaceError) as caught:
        profile_from_dict(data, source="bad.yaml")
    assert caught.value.field == field


def test_an_unknown_figure_is_refused():
    data = profile_to_dict(load_profile("mi250x-frontier"))
    data["uncertainty"] = {"peak": {"low": 0.9, "high": 1.0, "basis": "data sheet", "reason": "r"}}
    with pytest.raises(SpaceError) as caught:
        profile_from_dict(data, source="bad.yaml")
    assert caught.value.field == "uncertainty.peak"
