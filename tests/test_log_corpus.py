"""Every file of the real-log corpus (tests/fixtures/logs/, sources in its README) read as a
person would read it: the figures they would write down, with units, from the files that
have metric lines; the class (oom, error, timeout, lost node) and the rank's own line from
the failure excerpts; and a clear "expected ..." error from the files with neither.

The expectations below were written by reading each excerpt, not by running the parsers.
Every file must appear in exactly one table, and every file needs a README row with its
source's address, so the corpus cannot grow unread or unsourced.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.failures import failure_reason, reason_key
from parsearch.launch.oom import looks_like_oom
from parsearch.launch.process import _collateral
from parsearch.trainers.command.parsers import (
    EXPECTED_LINES,
    make_parser,
    no_metric_lines,
    parse_lines,
)
from parsearch.trainers.command.summary import NoMeasurement, summarize
from parsearch.trial import TrialSpec

ROOT = Path(__file__).parent.parent
LOGS = Path(__file__).parent / "fixtures" / "logs"
MIB, GIB = 1024**2, 1024**3


def _example_patterns(path: str) -> dict[str, Any]:
    """The regex settings of one of search_spaces/examples' spaces: what a user of that
    trainer runs, so the corpus checks the shipped patterns, not ones written for the test."""
    trainer = yaml.safe_load((ROOT / path).read_text())["trainer"]
    return {"patterns": trainer["patterns"], "scale": trainer.get("scale")}


# How each reader of a file is built: a parser name and the regex parser's settings.
READERS: dict[str, tuple[str, dict[str, Any]]] = {
    "megatron": ("megatron", {}),
    "megatron-deepspeed": ("megatron-deepspeed", {}),
    "torchtitan": ("torchtitan", {}),
    "deepspeed example": (
        "regex",
        _example_patterns("search_spaces/examples/deepspeed/deepspeed-zero-cpu.yaml"),
    ),
    "hf-trainer example": (
        "regex",
        _example_patterns("search_spaces/examples/hf-trainer/hf-trainer-gpt2-cpu.yaml"),
    ),
    # The per-step dict of microsoft's transformers fork: its own runtime and rate keys.
    "hf step dicts": (
        "regex",
        {
            "patterns": {
                "step_time_s": r"'train_step_runtime': ([0-9.]+)",
                "samples_per_s": r"'train_step_samples_per_second': ([0-9.]+)",
            }
        },
    ),
}


def scan(name: str, reader: str):
    parser, options = READERS[reader]
    with (LOGS / name).open() as lines:
        return parse_lines(
            lines, make_parser(parser, options.get("patterns"), options.get("scale"))
        )


def spec(dp=1, mbs=1, gas=1, seq=2048) -> TrialSpec:
    model = ModelSpec(num_layers=4, hidden_size=256, num_heads=4, vocab_size=1000, seq_length=seq)
    layout = ParallelLayout(tp=1, pp=1, dp=dp, mbs=mbs, gas=gas)
    allocation = AllocationSpec(
        nodes=1,
        devices_per_node=layout.world_size,
        device_memory_bytes=80 * GIB,
        peak_flops_per_device=1e15,
    )
    return TrialSpec("t", model, layout, allocation)


@dataclass(frozen=True)
class Figures:
    """What a reader writes down from a file: the steps printed, the first step's fields
    (seconds, samples/s, tokens/s per device, TFLOP/s per device, MFU as a fraction),
    peak memory in bytes, and optionally the trial's summary for a given layout."""

    steps: list[int]
    first: dict[str, Any]
    peak_mem_bytes: float | None = None
    peak_reserved_bytes: float | None = None
    layout: dict[str, int] = field(default_factory=dict)
    warmup: int = 0
    summary: dict[str, float] = field(default_factory=dict)


NO_FLOPS = {"reported_tflops_per_device": None}
FIGURES: dict[tuple[str, str], Figures] = {
    ("megatron-lm-h100.log", "megatron"): Figures(
        [10, 11, 12],
        {"step_time_s": 9.4964, "global_batch": 128, "reported_tflops_per_device": 137.5},
    ),
    ("megatron-lm-h100-memory.log", "megatron"): Figures(
        [2, 3],
        # an MoE's line: the loss is lm loss, not the load-balancing loss after it
        {"step_time_s": 5.6301, "loss": 2.021530, "reported_tflops_per_device": 231.9},
        54250.98583984375 * MIB,
        61480.0 * MIB,
    ),
    # MoE lines with the router's z_loss and load_balancing_loss between lm loss and the
    # loss scale: the loss read is lm loss, the step and batch as in a dense model's line.
    ("megatron-lm-moe-zloss-2024.log", "megatron"): Figures(
        [4, 6, 8],
        {"step_time_s": 18.489, "global_batch": 2048, "loss": 10.48763, **NO_FLOPS},
        # dp 16 as the post says; mbs and seq are the test's (the lines print neither)
        layout={"dp": 16, "mbs": 1, "gas": 128, "seq": 4096},
        warmup=4,  # iteration 4 left out: the median of 6 and 8
        summary={
            "step_time_s": (18.5192 + 18.4532) / 2,
            "tokens_per_s": (2048 * 4096 / 18.5192 + 2048 * 4096 / 18.4532) / 2,
        },
    ),
    ("megatron-lm-2026.log", "megatron"): Figures(
        [20],
        {"step_time_s": 0.744, "global_batch": 16, **NO_FLOPS},
        5670.39 * MIB,
        6406.0 * MIB,
    ),
    ("megatron-lm-bert-2022.log", "megatron"): Figures(
        [10],
        {"step_time_s": 0.3562, "global_batch": 4, "loss": None, **NO_FLOPS},
        layout={"dp": 2, "mbs": 2, "seq": 512},
        summary={"step_time_s": 0.3562, "tokens_per_s": 4 * 512 / 0.3562},
    ),
    ("megatron-llm-epfl-2023.log", "megatron"): Figures(
        [122, 123, 124, 125],
        {"step_time_s": 86.5452, "global_batch": 1024, "loss": 2.504220, **NO_FLOPS},
        layout={"dp": 8, "mbs": 1, "gas": 128, "seq": 2048},
        summary={
            "step_time_s": (87.8716 + 89.0752) / 2,
            "tokens_per_s": (1024 * 2048 / 87.8716 + 1024 * 2048 / 89.0752) / 2,
        },
    ),
    ("megatron-llm-falcon-nan-2023.log", "megatron"): Figures(
        [3383, 3384], {"step_time_s": 7.6131, "global_batch": 64, "loss": 0.7334521}
    ),
    ("megatron-deepspeed-polaris.log", "megatron-deepspeed"): Figures(
        [1, 2],
        {"step_time_s": 21.1338, "global_batch": 32, "seq_length": 4096},
        22332.37255859375 * MIB,
        35824.0 * MIB,
    ),
    ("megatron-deepspeed-polaris-timers.log", "megatron-deepspeed"): Figures(
        [199, 200],
        {"step_time_s": 14.2875, "global_batch": 768, "reported_tflops_per_device": 69.85},
        19.52 * GIB,
    ),
    ("megatron-deepspeed-bigscience-2023.log", "megatron-deepspeed"): Figures(
        [5426, 5427, 5428],
        {"step_time_s": 4.2479, "global_batch": 8, "seq_length": 2048, "loss": None},
        layout={"dp": 8, "mbs": 1, "seq": 2048},
        summary={  # warm-up counts iterations from 1: a run printed from 5426 on has none
            "step_time_s": 4.2292,
            "tokens_per_s": 8 * 2048 / 4.2292,
            "reported_tflops_per_device": 78.71,
        },
    ),
    # see_memory_usage's Max_MA 0.08 GB is the peak; the timer line says 0.02GB.
    ("deepspeed-see-memory-usage-2023.log", "megatron-deepspeed"): Figures(
        [], {}, 0.08 * GIB, 0.08 * GIB
    ),
    ("torchtitan-main-2026-05.log", "torchtitan"): Figures(
        list(range(14, 22)),
        {
            "tokens_per_s_per_device": 7282,
            "reported_tflops_per_device": 0.52,
            "reported_mfu": 0.0017,
        },
        peak_reserved_bytes=9.46 * GIB,
    ),
    ("torchtitan-all-ranks-2026-02.log", "torchtitan"): Figures(
        [4] * 7,
        {"tokens_per_s_per_device": 10050, "reported_tflops_per_device": 314.71},
        peak_reserved_bytes=66.91 * GIB,
    ),
    ("torchtitan-rank0-gc-2025-06.log", "torchtitan"): Figures(
        [200, 210, 220, 230, 240, 250],
        {
            "tokens_per_s_per_device": 5856,
            "reported_tflops_per_device": 339.16,
            "reported_mfu": 0.3429,
            "loss": 6.1384,
        },
        peak_reserved_bytes=49.66 * GIB,
        layout={"dp": 8, "seq": 8192},
        warmup=1,  # a step index, as torchtitan's: steps 200-250 are all measured
        summary={"tokens_per_s": 8 * (5862 + 5864) / 2, "reported_tflops_per_device": 339.535},
    ),
    ("deepspeed-running-avg-0.7.7.log", "deepspeed example"): Figures(
        [1, 2, 3, 4, 5, 6],
        {"samples_per_s": 159.628891629629},
        2.62 * GIB,
        layout={"seq": 128},
        warmup=1,
        summary={"tokens_per_s": 155.10475468488542 * 128},
    ),
    ("deepspeed-see-memory-usage-2023.log", "deepspeed example"): Figures(
        [1], {"samples_per_s": 2.1729161539995805}, 0.02 * GIB
    ),
    ("deepspeed-timer-samplespersec-2022.log", "deepspeed example"): Figures(
        [1, 2], {"samples_per_s": 83.48609168106144}, 9.02 * GIB
    ),
    # The end-of-run dict, values quoted (transformers 5): the run's samples/s, start-up in.
    ("hf-trainer-end-dict-strings-2026.log", "hf-trainer example"): Figures(
        [],
        {},
        layout={"dp": 1, "mbs": 2, "gas": 4, "seq": 1024},
        summary={"tokens_per_s": 1.474 * 1024, "step_time_s": 8 / 1.474},
    ),
    ("hf-trainer-step-dicts-tqdm-2021.log", "hf step dicts"): Figures(
        [1, 2, 3, 4, 5],
        {"step_time_s": 0.6309, "samples_per_s": 57.063},
        layout={"mbs": 36, "seq": 128},  # 0.6309 s x 57.063 samples/s: 36 per step
        warmup=1,
        summary={"step_time_s": (0.641 + 0.6715) / 2, "tokens_per_s": (56.162 + 53.608) / 2 * 128},
    ),
}

# File -> (class, the line that says why, or None where the excerpt holds no cause). The
# node agent's states: oom when any line is an out-of-memory one; otherwise error, where a
# timeout or a lost node shows as a rank that failed because a peer did (collateral: the
# culprit is looked for among the other ranks).
OOM, ERROR, TIMEOUT, LOST = "oom", "error", "timeout", "lost node"
FAILURES: dict[str, tuple[str, str | None]] = {
    "oom.log": (OOM, "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 16.00 GiB."),
    "oom-rank3-timestamped-2024.log": (
        OOM,
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 132.00 MiB. "
        "GPU 3 has a total capacity of 79.10 GiB",
    ),
    "oom-ddp-torch1.0-2019.log": (
        OOM,
        "RuntimeError: CUDA out of memory. Tried to allocate 1024.00 MiB (GPU 0; 15.90 GiB total "
        "capacity; 14.25 GiB already allocated",
    ),
    "oom-inside-error-message-2021.log": (
        OOM,
        "RuntimeError('CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.80 GiB total",
    ),
    "oom-runtimeerror-max-split-2023.log": (
        OOM,
        "RuntimeError: CUDA out of memory. Tried to allocate 296.00 MiB",
    ),
    "oom-cuda-error-torch2.2-2024.log": (OOM, "RuntimeError: CUDA error: out of memory"),
    "oom-deepspeed-chat-2023.log": (
        OOM,
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB",
    ),
    "oom-deepspeed-launcher-2023.log": (
        OOM,
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 978.00 MiB",
    ),
    "oom-two-ranks-interleaved.log": (
        OOM,
        ".OutOfMemoryError: CUDA out of memory. Tried to allocate 8.01 GiB. GPU 6",
    ),
    "oom-hip-traceback-2025.log": (
        OOM,
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 4.50 GiB.",
    ),
    "oom-hip-unified-2025.log": (
        OOM,
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 3.31 GiB.",
    ),
    "nccl-watchdog-ranks-2025.log": (
        TIMEOUT,
        "[Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, "
        "OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for "
        "600061 milliseconds before timing out.",
    ),
    "nccl-watchdog-no-prefix-2022.log": (
        TIMEOUT,
        "[Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508, "
        "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802220 milliseconds before timing out.",
    ),
    "nccl-watchdog-reduce-scatter-2024.log": (
        TIMEOUT,
        "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7753, "
        "OpType=_REDUCE_SCATTER_BASE,",
    ),
    "nccl-watchdog-after-tqdm-2024.log": (
        TIMEOUT,
        "[Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=64088,",
    ),
    "nccl-internal-error-rocm-2024.log": (
        ERROR,
        "torch.distributed.DistBackendError: NCCL error in: "
        "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, internal error, NCCL "
        "version 2.17.1",
    ),
    "segfault-megatron-childfailed.log": (ERROR, "Signal 11 (SIGSEGV) received by PID 6421"),
    "segfault-torchrun-peers-sigterm.log": (
        ERROR,
        "failed (exitcode: -11) local_rank: 1 (pid: 5528)",
    ),
    "segfault-fatal-python-error-2022.log": (ERROR, "Fatal Python error: Segmentation fault"),
    "ecc-error-nccl-watchdog.log": (
        ERROR,
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    ),
    "ecc-accelerate-rich.log": (ERROR, "RuntimeError: CUDA error: uncorrectable ECC error"),
    "ecc-cuda-runtime-error-2019.log": (
        ERROR,
        "RuntimeError: cuda runtime error (39) : uncorrectable ECC error encountered",
    ),
    "xid-fallen-off-bus-2025.log": (
        ERROR,
        "NVRM: fallen off the bus and is not responding to commands.",
    ),
    "lost-node-rendezvous-broken-pipe-2023.log": (LOST, "RuntimeError: Broken pipe"),
    "oom-then-childfailed-2024.log": (
        OOM,
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 792.00 MiB. GPU",
    ),
    # A GPU page fault: the HSA runtime's line, then the C library's abort; no exception.
    "rocm-page-fault-nanogpt-2023.log": (
        ERROR,
        "Memory access fault by GPU node-1 (Agent handle: 0x55e92f082620) on address (nil). "
        "Reason: Page not present or supervisor privilege.",
    ),
    # The DistBackendError line and NCCL's own detail, not NCCL's generic text for the code.
    "nccl-system-error-no-route-2024.log": (
        ERROR,
        "torch.distributed.DistBackendError: NCCL error in: "
        "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1333, unhandled system error (run "
        "with NCCL_DEBUG=INFO for details), NCCL version 2.18.6: socketStartConnect: Connect to "
        "192.168.19.14<52822> failed : No route to host",
    ),
    # The TCPStore's host went away: a rank that failed because another did.
    "tcpstore-recvvalue-reset-2025.log": (
        LOST,
        "recvValue failed on SocketImpl(fd=76, addr=[localhost]:60950, "
        "remote=[localhost]:29500): Connection reset by peer",
    ),
    # torchrun's report alone: its ChildFailedError is all a reader has.
    "childfailed-only-2025.log": (
        ERROR,
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    ),
    # Node 1's torchrun stopping its workers after node 0 failed: the cause is not here.
    "multinode-srun-labels-sigterm.log": (ERROR, None),
}

# Files with neither metric lines nor a failure, and the reader a user would point at them.
NEITHER: dict[str, str] = {
    "not-oom.log": "megatron",
    "rccl-warn-mi250x-2023.log": "megatron-deepspeed",
    "deepspeed-flops-profiler-2023.log": "megatron-deepspeed",
    "deepspeed-flops-profiler-megatron-2022.log": "megatron-deepspeed",
    "hf-tf-trainer-2020.log": "hf-trainer example",
    "hf-trainer-eval-dicts-2024.log": "hf-trainer example",
}


def _row_files(readme: str) -> dict[str, str]:
    """README table rows by their file name (first column, in backticks)."""
    rows = {}
    for line in readme.splitlines():
        match = re.match(r"\| `([^`]+)` \|", line)
        if match:
            rows[match.group(1)] = line
    return rows


def test_every_file_has_a_readme_row_with_a_url():
    rows = _row_files((LOGS / "README.md").read_text())
    files = {path.name for path in LOGS.iterdir() if path.name != "README.md"}
    assert files - rows.keys() == set(), "files without a README row"
    assert rows.keys() - files == set(), "README rows without a file"
    unsourced = [name for name, row in rows.items() if "https://github.com/" not in row]
    assert unsourced == [], "rows without the source's address"
    assert len(files) >= 40, f"the corpus has {len(files)} files"


def test_every_file_is_read_by_one_table():
    tables = [{name for name, _ in FIGURES}, set(FAILURES), set(NEITHER)]
    files = {path.name for path in LOGS.glob("*.log")}
    assert set().union(*tables) == files, sorted(files ^ set().union(*tables))
    assert not (tables[0] & tables[1]) and not (tables[1] & tables[2]), "a file in two tables"


@pytest.mark.parametrize("name, reader", sorted(FIGURES))
def test_figures_a_reader_writes_down(name, reader):
    expected = FIGURES[name, reader]
    result = scan(name, reader)
    assert [step.index for step in result.steps] == expected.steps, result.steps
    if expected.steps:
        first = result.steps[0]
        seen = {key: getattr(first, key) for key in expected.first}
        assert seen == pytest.approx(expected.first), first
    assert result.peak_mem_bytes == pytest.approx(expected.peak_mem_bytes), result
    assert result.peak_reserved_bytes == pytest.approx(expected.peak_reserved_bytes), result
    if expected.summary:
        metrics = summarize(result, spec(**expected.layout), expected.warmup)
        seen = {key: metrics.get(key) for key in expected.summary}
        assert seen == pytest.approx(expected.summary), metrics


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_failure_excerpts_are_classified_with_the_ranks_own_line(name):
    kind, line = FAILURES[name]
    text = (LOGS / name).read_text()
    for reader in ("megatron-deepspeed", "torchtitan", "deepspeed example"):
        assert not scan(name, reader).has_metrics, f"{name} would be measured by {reader}"
    assert looks_like_oom(text) is (kind == OOM), f"{name}: expected {kind}"
    assert _collateral(text) is (kind in (TIMEOUT, LOST)), f"{name}: expected {kind}"
    stored = "rank 0 ran out of memory" if kind == OOM else "rank 0 exited with code 1"
    reason = failure_reason(stored, text)
    if line is None:
        assert reason == stored
    else:
        assert reason.startswith(f"{stored}: ") and line in reason, reason


@pytest.mark.parametrize("name", sorted(NEITHER))
def test_files_without_metric_lines_say_which_line_was_expected(name):
    reader = NEITHER[name]
    text = (LOGS / name).read_text()
    assert not looks_like_oom(text)
    result = scan(name, reader)
    with pytest.raises(NoMeasurement, match=r"no metric lines|neither a step time nor a rate"):
        summarize(result, spec(), warmup_steps=0)
    parser = READERS[reader][0]
    assert no_metric_lines(parser, name) == (
        f"no {parser} metric lines in {name}: expected {EXPECTED_LINES[parser]}"
    )


@pytest.mark.parametrize("name, reader", sorted(FIGURES))
def test_metric_files_are_not_failures(name, reader):
    assert not looks_like_oom((LOGS / name).read_text())


def test_the_reason_is_the_ranks_line_not_what_follows_a_failure():
    """What the corpus showed last_exception picking before: a C++ stack header, the
    watchdog's follow-up line, torchrun's ChildFailedError over the rank's own error."""
    tail = "\n".join(
        [
            "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered",
            "Exception raised from c10_cuda_check_implementation at CUDAException.cpp:44:",
            "[rank1]:[E1 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 1] Exception (either an error "
            "or timeout) detected by watchdog at work: 7, last enqueued NCCL work: 8.",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        ]
    )
    assert failure_reason("rank 1 exited with code 1", tail) == (
        "rank 1 exited with code 1: RuntimeError: CUDA error: an illegal memory access was "
        "encountered"
    )
    launcher_only = "Traceback (most recent call last):\n  ...\nfoo.ChildFailedError: \n"
    assert failure_reason(None, launcher_only) == "foo.ChildFailedError:"


def test_the_agents_oom_reason_names_the_out_of_memory_line():
    """The node agent stores "rank N ran out of memory" alone; the reason adds the first
    out-of-memory line even when a later exception line (a launcher's) follows it."""
    tail = (
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
        "RuntimeError: the trainer's own wrapper failed\n"
    )
    assert failure_reason("rank 0 ran out of memory", tail) == (
        "rank 0 ran out of memory: [rank0]: torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 2.00 GiB."
    )
    assert failure_reason("rank 0 ran out of memory: x", tail) == "rank 0 ran out of memory: x"


def test_an_xid_line_is_the_reason_of_a_rank_without_an_exception():
    """The Xid form of a GPU lost to the driver, as quoted in NVIDIA/NVSentinel#155."""
    tail = "step 10\nNVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus\n"
    assert failure_reason("rank 0 was killed by SIGKILL", tail) == (
        "rank 0 was killed by SIGKILL: NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"
    )


def test_page_faults_at_other_addresses_read_alike():
    """Two ranks' faults differ in their agent handle only: one group, not two."""
    text = (LOGS / "rocm-page-fault-nanogpt-2023.log").read_text()
    other = text.replace("0x55e92f082620", "0x5f6d730")
    first, second = (failure_reason("rank 0 exited with code 134", tail) for tail in (text, other))
    assert first != second and reason_key(first) == reason_key(second), (first, second)
