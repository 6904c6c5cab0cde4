"""GEMM time by shape: tile and wave quantisation on a device profile's tiles (issue 50)."""

from __future__ import annotations

import dataclasses

import pytest

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.estimate import EstimateSettings, predict
from parsearch.estimate.band import predict_band, predict_scaled
from parsearch.estimate.machine import GemmTiles, wave_efficiency
from parsearch.estimate.profile import profile_from_dict, profile_to_dict, with_machine
from parsearch.estimate.timing import gemm_efficiency
from parsearch.profiles import load_profile

A100_TILE = GemmTiles(tiles=((128, 128),), units=108, k_pipeline=128)
MODEL = ModelSpec(
    name="gpt-2.3k",
    num_layers=24,
    hidden_size=2304,
    num_heads=24,
    seq_length=2048,
    vocab_size=51200,
)
SELENE = AllocationSpec(
    name="dgx-a100",
    nodes=1,
    devices_per_node=8,
    device_memory_bytes=80 * 10**9,
    peak_flops_per_device=312e12,
    intra_node_bandwidth_bytes_per_s=230e9,
    inter_node_bandwidth_bytes_per_s=25e9,
)


def test_wave_quantisation_of_a_hand_computed_shape():
    # 1536/128 = 12 tiles a side, 144 tiles on 108 SMs: 2 waves, 144 of 216 slots busy;
    # K = 1024 spends 1024 of 1024 + 128 elements of its pipeline computing.
    got = wave_efficiency(1536, 1536, 1024, A100_TILE)
    assert got == pytest.approx(144 / 216 * 1024 / 1152), got
    # A partial edge tile computes in full: 1281 columns need an 11th tile column, and
    # 110 tiles a second wave of 108 SMs; 1280 columns fit 100 tiles in one wave.
    one_wave = wave_efficiency(1280, 1280, 1024, A100_TILE)
    assert one_wave == pytest.approx(100 / 108 * 1024 / 1152), one_wave
    two_waves = wave_efficiency(1280, 1281, 1024, A100_TILE)
    assert two_waves == pytest.approx(1280 * 1281 / (216 * 128 * 128) * 1024 / 1152), two_waves


def test_a_narrow_tensor_parallel_slice_is_slower_per_flop_than_a_wide_one():
    settings = with_machine(
        EstimateSettings(), load_profile("a100-80gb-dgx"), dataclasses.replace(SELENE)
    )
    wide = gemm_efficiency(MODEL, ParallelLayout(1, 1, 8, 1, 1), settings)
    narrow = gemm_efficiency(MODEL, ParallelLayout(8, 1, 1, 1, 1), settings)
    assert narrow < 0.95 * wide, (narrow, wide)
    # And below the ceiling the measured shapes imply, which no shape passes.
    assert wide < settings.machine.gemm_tiles.ceiling <= 1.0, wide


@pytest.mark.parametrize(
    "name,units",
    [
        ("a100-80gb-dgx", 108),
        ("h100-sxm-dgx", 132),
        ("h200-sxm-hgx", 132),
    ],
)
def test_shipped_tiles_load_cite_and_widen_the_band(name, units):
    profile = load_profile(name)
    assert profile.gemm_tiles is not None and profile.gemm_tiles.units == units
    assert any(line.startswith("GEMM tiles") for line in profile.sources), profile.sources
    assert profile_from_dict(profile_to_dict(profile)).gemm_tiles == profile.gemm_tiles
    pipeline = {item.figure: item for item in profile.uncertainty}["gemm_pipeline"]
    allocation = dataclasses.replace(
        SELENE,
        devices_per_node=profile.devices_per_node,
        peak_flops_per_device=profile.peak_flops_per_device,
    )
    settings = with_machine(EstimateSettings(), profile, allocation)
    layout = ParallelLayout(profile.devices_per_node, 1, 1, 1, 4)
    nominal = predict(MODEL, layout, allocation, settings).tokens_per_s
    slow = predict_scaled(
        MODEL, layout, allocation, settings, {"gemm_pipeline": pipeline.slow()}
    ).tokens_per_s
    fast = predict_scaled(
        MODEL, layout, allocation, settings, {"gemm_pipeline": pipeline.fast()}
    ).tokens_per_s
    band = predict_band(MODEL, layout, allocation, settings)
    assert band.tokens_per_s_low <= slow < nominal < fast <= band.tokens_per_s_high, (
        band,
        slow,
        nominal,
        fast,
    )
