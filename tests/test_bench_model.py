"""The benchmark's model, settings and rank environment, without starting any process."""

from __future__ import annotations

import pytest
import torch
from bench_helpers import GLOBAL_BATCH, one_thread, tiny_spec
from torch.utils.flop_counter import FlopCounterMode

from parsearch.errors import TrainerError
from parsearch.estimate import flops_breakdown, param_count
from parsearch.trainers.builtin.env import RankEnv
from parsearch.trainers.builtin.model import Transformer, loss_fn, materialize
from parsearch.trainers.builtin.parallelize import apply_recompute, schedule_used, split_stage
from parsearch.trainers.builtin.plain import plain_training
from parsearch.trainers.builtin.trainer import TrainerSettings, synthetic_batch

ARCHS = [{}, {"arch": "llama", "num_kv_heads": 2}]


def build(spec, recompute: str = "none") -> Transformer:
    with torch.device("meta"):
        model = Transformer(spec.model)
    materialize(model, torch.device("cpu"), spec.seed)
    apply_recompute(model, recompute)
    return model


@pytest.mark.parametrize("model", ARCHS)
def test_parameter_count_matches_the_estimate(model):
    spec = tiny_spec(model=model)
    assert sum(p.numel() for p in build(spec).parameters()) == param_count(spec.model)


def test_pipeline_stages_start_from_the_whole_models_weights():
    """Initialisation is keyed by global parameter names, so a stage (and the last stage's
    copy of the tied embedding) gets exactly the whole model's values."""
    spec = tiny_spec()
    whole = dict(build(spec).named_parameters())
    with torch.device("meta"):
        meta = Transformer(spec.model)
    for stage in range(4):
        part = split_stage(meta, stage, 4)
        materialize(part, torch.device("cpu"), spec.seed)
        for name, param in part.named_parameters():
            source = "embed.tok.weight" if name == "output.weight" else name
            assert torch.equal(param, whole[source]), name


def test_only_gpt_ties_its_embedding():
    gpt = build(tiny_spec())
    assert gpt.output.weight is gpt.embed.tok.weight
    llama = build(tiny_spec(model={"arch": "llama"}))
    assert llama.output.weight is not llama.embed.tok.weight


def test_synthetic_batch_depends_only_on_seed_and_global_batch():
    a, b = synthetic_batch(tiny_spec(1, 1, 2)), synthetic_batch(tiny_spec(1, 1, 1))
    assert torch.equal(a, b)
    assert a.shape == (GLOBAL_BATCH, 33)
    assert not torch.equal(a, synthetic_batch(tiny_spec(model={"vocab_size": 64})))


def test_reference_loop_learns():
    with one_thread():
        losses, times = plain_training(tiny_spec(), 5)
    assert losses[0] == pytest.approx(torch.log(torch.tensor(128.0)).item(), abs=0.1)
    assert losses[-1] < losses[0] - 0.5
    assert len(times) == 5


@pytest.mark.parametrize("model", ARCHS)
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_flops_match_torch_flop_counter(model, recompute):
    """FlopCounterMode on CPU counts no FLOPs inside ``scaled_dot_product_attention`` (the
    fused kernel has no formula there), i.e. the ``12·B·s²·h`` per layer of attention score
    matmuls of a training step; we compare it with ``total - attention``."""
    spec = tiny_spec(model=model)
    net = build(spec, recompute)
    tokens = synthetic_batch(spec)
    with FlopCounterMode(display=False) as counter, one_thread():
        loss_fn(net(tokens[:, :-1]), tokens[:, 1:]).backward()
    expected = flops_breakdown(spec.model, GLOBAL_BATCH, recompute=recompute)
    counted = expected["total"] - expected["attention"]
    if recompute == "full":
        # Non-reentrant checkpointing stops recomputing once backward has every tensor it
        # saved: the layer's last matmul (FFN down-projection) is not re-run.
        tokens_per_step = GLOBAL_BATCH * spec.model.seq_length
        m = spec.model
        counted -= 2 * tokens_per_step * m.ffn * m.hidden_size * m.num_layers
    assert counter.get_total_flops() == pytest.approx(counted, rel=0.01)


def test_schedule_used():
    def used(requested="1f1b", **layout):
        return schedule_used(tiny_spec(**layout).layout, requested)

    assert used() is None
    assert used(pp=2) == "1f1b"
    assert used("gpipe", pp=2) == "gpipe"
    assert used(pp=2, vpp=2) == "interleaved1f1b"
    assert used(pp=4, gas=2) == "gpipe"  # torch's 1F1B needs gas >= pp
    with pytest.raises(TrainerError, match="schedule"):
        used("zigzag", pp=2)


def test_trainer_settings_validate():
    assert TrainerSettings.from_spec(tiny_spec()).steps == 3
    with pytest.raises(TrainerError, match="schedule"):
        TrainerSettings.from_spec(tiny_spec(trainer={"schedule": "zigzag"}))
    with pytest.raises(TrainerError, match="warmup_steps"):
        TrainerSettings.from_spec(tiny_spec(trainer={"warmup_steps": -1}))
    assert TrainerSettings.from_spec(tiny_spec(trainer={"timeout": 60})).steps == 3
    enforced = tiny_spec(trainer={"enforce_memory_cap": True})
    assert TrainerSettings.from_spec(enforced).memory_cap(enforced) == 2**30
    capped = tiny_spec(trainer={"memory_cap_bytes": 123})
    assert TrainerSettings.from_spec(capped).memory_cap(capped) == 123
    assert TrainerSettings.from_spec(tiny_spec()).memory_cap(tiny_spec()) is None


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, (0, 1, 0, 1, None)),
        (
            {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"},
            (5, 8, 1, 4, "29500"),
        ),
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            },
            (3, 4, 1, 2, "29500"),
        ),
        (
            {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"},
            (2, 4, 0, 2, "29500"),
        ),
        (
            {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2"},
            (6, 8, 2, 8, "29500"),
        ),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2(x1)"}, None),
    ],
)
def test_rank_environment_of_each_launcher(environ, expected):
    if environ:
        environ = environ | {"MASTER_PORT": "29500", "MASTER_ADDR": "node0"}
    env = RankEnv.from_environ(environ)
    if expected is None:
        assert (env.rank, env.world_size, env.local_world_size) == (1, 2, 2)
        return
    rank, world, local, local_world, port = expected
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (
        rank,
        world,
        local,
        local_world,
    )
    assert env.master_port == (int(port) if port else None)


def test_rank_environment_needs_a_port_with_several_ranks():
    with pytest.raises(TrainerError, match="MASTER_PORT"):
        RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2"})
