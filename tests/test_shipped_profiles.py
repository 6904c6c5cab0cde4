"""The device profiles that ship (parsearch/profiles/): they load, say where every figure
came from, fit any node count of their node shape, round-trip through a campaign's stored
form, are named by the shipped GPU spaces, and `parsearch plan` says which one it used."""

import json
from pathlib import Path

import pytest
import yaml

from parsearch.cli import main
from parsearch.errors import SpaceError
from parsearch.estimate.machine import ring_volume
from parsearch.estimate.profile import profile_from_dict, profile_to_dict
from parsearch.profiles import load_profile, shipped
from parsearch.space import load_space

ROOT = Path(__file__).parent.parent
SPACES = sorted((ROOT / "search_spaces").glob("*.yaml"))


@pytest.mark.parametrize("name", sorted(shipped()))
def test_a_shipped_profile_loads_with_its_sources(name):
    profile = load_profile(name)
    assert profile.nodes is None  # a node shape: any number of nodes
    assert profile.gemm_shapes and not profile.gemm  # benchmarked GEMMs, not probed layers
    assert profile.memory_bandwidth_bytes_per_s and profile.device
    assert any(line.startswith("GEMM:") for line in profile.sources)
    assert profile.collective("tp-intra-node", "all-reduce", profile.devices_per_node)
    assert profile.collective("dp-across-nodes", "all-reduce", 2)
    # The form a campaign stores gives the same profile back.
    again = profile_from_dict(profile_to_dict(profile), source=profile.path)
    assert again.gemm_shapes == profile.gemm_shapes
    assert again.sources == profile.sources and again.nodes is None
    assert again.attention_flops == profile.attention_flops
    for fit, back in zip(profile.collectives, again.collectives, strict=True):
        assert back.beta_s_per_byte == pytest.approx(fit.beta_s_per_byte, rel=1e-5)
        assert back.alpha_s == pytest.approx(fit.alpha_s, rel=1e-5)


def test_a_bus_bandwidth_is_the_rings_share_of_the_buffer_per_second():
    data = yaml.safe_load((ROOT / "parsearch/profiles/a100-80gb-dgx.yaml").read_text())
    profile = profile_from_dict(data)
    fit = profile.collective("tp-intra-node", "all-reduce", 8)
    # nccl-tests: busbw = algbw * 2(n-1)/n; the fit's bandwidth is the algorithm bandwidth.
    assert 1 / fit.beta_s_per_byte == pytest.approx(230.8e9 / (2 * 7 / 8))
    assert ring_volume("all-reduce", 8) == pytest.approx(2 * 7 / 8)


def test_every_gpu_space_names_a_shipped_profile():
    for path in SPACES:
        space = load_space(path)
        if space.allocation.device == "cpu":
            continue
        assert space.estimate.machine is not None, path.name
        assert Path(space.estimate.machine.path).parent == ROOT / "parsearch" / "profiles"


def test_a_node_shape_profile_fits_any_node_count_but_not_another_node(tmp_path):
    space = load_space(ROOT / "search_spaces" / "gpt-22b-frontier.yaml")
    assert space.estimate.machine.name == "mi250x-frontier"
    data = yaml.safe_load((ROOT / "search_spaces" / "gpt-22b-frontier.yaml").read_text())
    data["allocation"]["devices_per_node"] = 4
    data["search"]["tp"] = [1, 2, 4]
    path = tmp_path / "four.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpaceError, match="nodes of 8 device"):
        load_space(path)


def test_a_profiles_memory_per_device_is_the_limit():
    space = load_space(ROOT / "search_spaces" / "llama3-8b-h200.yaml")
    assert space.memory_limit_bytes == 141 * 10**9


def test_plan_says_which_profile_and_where_its_figures_came_from(capsys):
    assert main(["plan", str(ROOT / "search_spaces" / "gpt-175b-frontier.yaml"), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "machine profile mi250x-frontier" in out
    assert "source: GEMM: stas00/ml-engineering" in out
    assert main(["plan", str(ROOT / "search_spaces" / "tiny-cpu.yaml"), "--top", "1"]) == 0
    assert "machine: no profile" in capsys.readouterr().out
    space = str(ROOT / "search_spaces" / "llama3-8b-h200.yaml")
    assert main(["plan", space, "--top", "1", "--format", "json"]) == 0
    machine = json.loads(capsys.readouterr().out)["machine"]
    assert machine["name"] == "h200-sxm-hgx" and machine["sources"]
    assert main(["plan", space, "--machine", "nonexistent-profile"]) == 2
    assert "shipped profiles: " in capsys.readouterr().err


def test_a_shipped_name_made_absolute_still_names_the_shipped_profile(tmp_path):
    from parsearch.profiles import resolve

    assert resolve(str(tmp_path / "mi250x-frontier")) == shipped()["mi250x-frontier"]
    (tmp_path / "mi250x-frontier").write_text("name: mine")
    assert resolve(str(tmp_path / "mi250x-frontier")) == tmp_path / "mi250x-frontier"
    assert resolve("h100-sxm-dgx.yaml", tmp_path) == tmp_path / "h100-sxm-dgx.yaml"


def test_the_hopper_profiles_time_attention_at_flashattention_2s_published_rate():
    for name in ("h100-sxm-dgx", "h200-sxm-hgx"):
        assert load_profile(name).attention_flops == pytest.approx(0.35 * 989e12, rel=1e-3)
