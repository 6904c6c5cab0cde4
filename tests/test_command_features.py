"""What users of real trainers need from the command trainer: the memory cap (enforced and
passed to the program), a working directory, one plain process per trial, and regex
patterns with a role (per step or a summary printed once).

Trials run a small Python program (written by each test) through the real node agent.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from trials_seen import trials_seen

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.errors import SpaceError
from parsearch.launch.placement import NodePlacement
from parsearch.launch.process import free_port
from parsearch.result import TrialState
from parsearch.space import space_from_dict
from parsearch.store import TrialRecord
from parsearch.trainers.command.parsers import make_parser, parse_lines
from parsearch.trainers.command.summary import summarize
from parsearch.trainers.command.trainer import run_node, validate_section
from parsearch.trial import TrialSpec

MIB = 2**20
SEQ = 64
# Prints what it was given and what it sees, then the lines in LINES (a JSON list).
PROGRAM = """
import json, os, sys
print("ARGV " + json.dumps(sys.argv[1:]))
print("CWD " + os.getcwd())
print("ENV " + json.dumps({k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}))
for line in json.loads(os.environ["LINES"]):
    print(line)
"""


def trainer(tmp_path: Path, lines: list[str], **keys) -> dict:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    data = {
        "kind": "command",
        "command": [sys.executable, str(program), *keys.pop("args", [])],
        "env": {"LINES": json.dumps(lines).replace("{", "{{").replace("}", "}}")},
        "parser": "json",
        "steps": 4,
        "warmup_steps": 1,
        **keys,
    }
    return validate_section(data, "test")


def spec(section: dict, dp: int = 1, mbs: int = 2, cap: int | None = None) -> TrialSpec:
    model = ModelSpec(num_layers=2, hidden_size=64, num_heads=4, vocab_size=100, seq_length=SEQ)
    allocation = AllocationSpec(1, dp, 1 << 30, 1e12, device="cpu")
    layout = ParallelLayout(tp=1, pp=1, dp=dp, mbs=mbs, gas=2)
    return TrialSpec("t1", model, layout, allocation, section, timeout_s=30, memory_cap_bytes=cap)


def run(trial: TrialSpec, tmp_path: Path):
    trial_dir = tmp_path / "trial"
    result = run_node(NodePlacement(trial, 0, 1, "127.0.0.1", free_port("127.0.0.1"), trial_dir))
    return result, (trial_dir / "rank0.log").read_text()


def said(log: str, what: str):
    line = next(line for line in log.splitlines() if line.startswith(what + " "))
    return line.split(" ", 1)[1]


# --- memory cap ------------------------------------------------------------------------


def json_line(peak_mib: float) -> str:
    return json.dumps({"tokens_per_s": 1000.0, "peak_mem_bytes": peak_mib * MIB})


def test_a_peak_above_the_memory_cap_is_oom_naming_both(tmp_path):
    section = trainer(tmp_path, [json_line(52.3)])
    result, _ = run(spec(section, cap=40 * MIB), tmp_path)
    assert result.status is TrialState.OOM, trials_seen([result])
    assert "measured peak memory 52.3 MiB" in result.error and "memory_cap 40 MiB" in result.error
    assert result.metrics["peak_mem_bytes"] == int(52.3 * MIB)  # kept for `parsearch show`
    under, _ = run(spec(trainer(tmp_path, [json_line(39.0)]), cap=40 * MIB), tmp_path)
    assert under.status is TrialState.OK, trials_seen([under])


# Allocates (and touches) MIB_USED MiB, says nothing of it unless told to, then ends.
HUNGRY = """
import json, sys, time
block = b"\\x01" * (int(sys.argv[1]) * 2**20)
time.sleep(0.6)
line = {"tokens_per_s": 1000.0}
if sys.argv[2] == "report":
    status = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
    line["peak_mem_bytes"] = int(status) * 1024
print(json.dumps(line))
"""


def test_memory_is_measured_by_parsearch_and_capped_without_a_report(tmp_path):
    program = tmp_path / "hungry.py"
    program.write_text(HUNGRY)
    section = trainer(tmp_path, [])
    section["command"] = [sys.executable, str(program), "150", "silent"]
    result, _ = run(spec(validate_section(section, "t"), cap=100 * MIB), tmp_path)
    assert result.status is TrialState.OOM, result
    assert "exceeds memory_cap 100 MiB" in result.error
    assert 150 * MIB < result.metrics["measured_peak_rss_bytes"] < 200 * MIB
    section["command"][-1] = "report"
    result, _ = run(spec(validate_section(section, "t"), cap=400 * MIB), tmp_path)
    assert result.ok
    reported = result.metrics["reported_peak_mem_bytes"]
    measured = result.metrics["measured_peak_rss_bytes"]
    assert measured == pytest.approx(reported, rel=0.1)
    assert result.metrics["peak_mem_bytes"] == max(reported, measured)


# A light rank that runs a child (HUNGRY, allocating 150 MiB) under the name in argv[1], as
# DeepSpeed runs ninja and g++ (cc1plus) to build its ops at first use, then reports.
BUILDS = """
import json, subprocess, sys
subprocess.run([sys.argv[1], sys.argv[2], "150", "silent"], check=True, stdout=subprocess.DEVNULL)
print(json.dumps({"tokens_per_s": 1000.0}))
"""


@pytest.mark.parametrize("name, counted", [("cc1plus", False), ("helper", True)])
def test_a_compiler_the_rank_runs_is_not_its_memory(tmp_path, name, counted):
    """The same allocating child counts as the rank's memory under a program's name and not
    under a compiler's (the kernel names a process after the file it runs: a link)."""
    (tmp_path / "hungry.py").write_text(HUNGRY)
    (tmp_path / "builds.py").write_text(BUILDS)
    (tmp_path / name).symlink_to(sys.executable)
    section = trainer(tmp_path, [])
    files = [str(tmp_path / file) for file in ("builds.py", name, "hungry.py")]
    section["command"] = [sys.executable, *files]
    result, _ = run(spec(validate_section(section, "t"), cap=100 * MIB), tmp_path)
    measured = result.metrics.get("measured_peak_rss_bytes", 0)
    assert (result.status is TrialState.OOM) is counted, trials_seen([result])
    assert (measured > 150 * MIB) is counted, measured


def test_the_cap_reaches_the_program(tmp_path):
    section = trainer(tmp_path, [json_line(1)], args=["{memory_cap}", "{memory_cap_bytes}"])
    _, log = run(spec(section, cap=40 * MIB), tmp_path)
    assert json.loads(said(log, "ARGV")) == ["40MiB", str(40 * MIB)]
    _, log = run(spec(section), tmp_path)  # no cap: the device's memory
    assert json.loads(said(log, "ARGV")) == ["1GiB", str(1 << 30)]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_campaign_with_failures_shows_why_everywhere(tmp_path):
    """mbs 4 is fastest but measures 52 MiB over a 40 MiB cap; mbs 8 raises. best, status,
    show and the report agree on the best (mbs 2) and say why the others failed."""
    program = tmp_path / "fast_but_big.py"
    program.write_text(
        "import json, sys\nmbs = int(sys.argv[1])\n"
        "if mbs > 4:\n    raise ValueError(f'mbs {mbs} does not fit this model')\n"
        "peak = {'peak_mem_bytes': 13 * mbs * 2**20} if mbs > 1 else {}  # mbs 1: not measured\n"
        "print(json.dumps({'tokens_per_s': 1000.0 * mbs, **peak}))\n"
    )
    space = {
        "name": "capped",
        "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 128,
                  "seq_length": 32},
        "allocation": {"nodes": 1, "devices_per_node": 1, "device": "cpu",
                       "device_memory": "1GiB", "peak_tflops": 0.05},
        "search": {"tp": 1, "pp": 1, "mbs": [1, 2, 4, 8], "gas": 1},
        "memory_cap": "40MiB",
        "trainer": {"kind": "command", "parser": "json",
                    "command": [sys.executable, str(program), "{mbs}"]},
    }  # fmt: skip
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "parsearch", *args], cwd=tmp_path, capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    cli("run", "space.yaml", "--store", "c.db", "--budget", "4", "--quiet",
        "--keep-predicted-oom")  # fmt: skip
    best = json.loads(cli("best", "--store", "c.db", "--format", "json"))
    assert best["layout"]["mbs"] == 2
    capped = cli("best", "--store", "c.db", "--max-mem", "30MiB")
    # mbs 1 prints no memory, but parsearch measured its ranks itself: nothing is left out.
    assert "without a measured peak memory" not in capped and "mbs2" in capped
    status = json.loads(cli("status", "--store", "c.db", "--format", "json"))
    assert status["states"]["oom"] == 1 and status["best"]["layout"]["mbs"] == 2
    reasons = {group["state"]: group["reason"] for group in status["failures"]}
    assert "measured peak memory 52 MiB" in reasons["oom"]
    assert "memory_cap 40 MiB" in reasons["oom"]
    assert reasons["error"] == (
        "rank 0 exited with code 1: ValueError: mbs 8 does not fit this model"
    )
    text = cli("status", "--store", "c.db")
    assert "error x1" in text and "ValueError: mbs 8 does not fit" in text
    number = next(g["trials"][0] for g in status["failures"] if g["state"] == "error")
    shown = cli("show", "--store", "c.db", "--trial", str(number))
    assert "why        rank 0 exited with code 1: ValueError: mbs 8" in shown
    assert f"command    {sys.executable} {program} 8" in shown
    assert "raise ValueError" in shown  # the log tail
    cli("report", "--store", "c.db", "--out", "report")
    html = (tmp_path / "report" / "index.html").read_text()
    assert "<h2>Failures</h2>" in html and "exceeds memory_cap 40 MiB" in html
    assert "Trial #" + str(best["trial"]) in html and "1 node × 1 device =" in html


# --- working directory and launch modes ------------------------------------------------


def test_cwd_with_placeholders_relative_to_the_trial_directory(tmp_path):
    checkout = tmp_path / "checkout-1"
    checkout.mkdir()
    section = trainer(tmp_path, [json_line(1)], cwd=str(tmp_path / "checkout-{tp}"))
    result, log = run(spec(section), tmp_path)
    assert result.ok and said(log, "CWD") == str(checkout)
    relative = trainer(tmp_path, [json_line(1)], cwd="sub")
    (tmp_path / "trial" / "sub").mkdir(parents=True)
    _, log = run(spec(relative), tmp_path)
    assert said(log, "CWD") == str(tmp_path / "trial" / "sub")


def test_a_missing_cwd_is_a_failed_start_naming_it(tmp_path):
    section = trainer(tmp_path, [json_line(1)], cwd=str(tmp_path / "nowhere"))
    with pytest.raises(NotADirectoryError, match=r"trainer.cwd: .*nowhere is not a directory"):
        run(spec(section), tmp_path)


def test_single_launch_is_one_plain_process(tmp_path):
    section = trainer(tmp_path, [json_line(1)], launch="single")
    result, log = run(spec(section, dp=2), tmp_path)
    assert result.ok
    assert json.loads(said(log, "ENV")) == {"RANK": None, "WORLD_SIZE": None, "MASTER_ADDR": None}
    assert sorted(p.name for p in (tmp_path / "trial").glob("rank*.log")) == ["rank0.log"]


def test_a_per_node_launcher_that_fails_is_named_as_the_node(tmp_path):
    section = trainer(tmp_path, [], launch="per_node")
    section["command"] = [sys.executable, "-c", "import sys; sys.exit(3)"]
    result, _ = run(spec(validate_section(section, "t"), dp=2), tmp_path)
    assert result.error == "node 0 exited with code 3"


def test_single_launch_on_several_nodes_is_refused():
    data = {
        "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 128,
                  "seq_length": 32},
        "allocation": {"nodes": 2, "devices_per_node": 1, "device_memory": "1GiB",
                       "peak_tflops": 1},
        "search": {"tp": 1, "pp": 1, "mbs": 1, "gas": 1},
        "trainer": {"kind": "command", "launch": "single", "command": ["x"]},
    }  # fmt: skip
    with pytest.raises(SpaceError, match="single runs one process per trial") as caught:
        space_from_dict(data, source="s.yaml")
    assert caught.value.field == "trainer.launch"


# --- regex patterns with roles ---------------------------------------------------------


def regex_trainer(tmp_path, lines, patterns, scale=None):
    keys = {"parser": "regex", "patterns": patterns}
    if scale is not None:
        keys["scale"] = scale
    return trainer(tmp_path, lines, **keys)


def test_per_step_loss_next_to_a_summary_rate(tmp_path):
    """Hugging Face's shape: a loss line per step, samples per second once at the end."""
    lines = [f"{{'loss': {4 - step / 10}}}" for step in range(4)]
    lines.append("{'train_runtime': 3.2, 'train_samples_per_second': 20.5}")
    patterns = {
        "loss": r"'loss': ([0-9.]+)",
        "samples_per_s": {"pattern": r"'train_samples_per_second': ([0-9.]+)", "role": "summary"},
    }
    result, _ = run(spec(regex_trainer(tmp_path, lines, patterns)), tmp_path)
    assert result.ok, result.error
    assert result.metrics["tokens_per_s"] == pytest.approx(20.5 * SEQ)
    assert result.metrics["step_time_s"] == pytest.approx(4 * SEQ / (20.5 * SEQ))  # gb 4
    assert result.metrics["loss"] == pytest.approx(3.7)


def test_timed_steps_win_over_a_summary_rate():
    """The Hugging Face example's shape: a callback's step times and the Trainer's own
    end-of-run rate, which counts its start-up: the steps decide, their warm-up left out."""
    patterns = {
        "step_time_s": r"step_time=([0-9.]+)",
        "samples_per_s": {"pattern": r"'train_samples_per_second': '?([0-9.]+)", "role": "summary"},
    }
    lines = ["step_time=0.9", "step_time=0.2", "step_time=0.2"]
    scan = parse_lines(
        [*lines, "{'train_samples_per_second': '2.5'}"], make_parser("regex", patterns)
    )
    trial = spec(validate_section({"kind": "command", "command": ["x"]}, "t"))
    metrics = summarize(scan, trial, warmup_steps=1)
    assert metrics["step_time_s"] == pytest.approx(0.2), metrics  # not 4 samples / 2.5 per s
    alone = parse_lines(["{'train_samples_per_second': '2.5'}"], make_parser("regex", patterns))
    assert summarize(alone, trial, warmup_steps=1)["tokens_per_s"] == pytest.approx(2.5 * SEQ)


def test_a_log_where_only_the_memory_pattern_matched_says_so(tmp_path):
    patterns = {"step_time_s": r"step took ([0-9.]+) s", "peak_mem_bytes": r"peak (\d+) B"}
    result, _ = run(spec(regex_trainer(tmp_path, ["peak 1000 B"], patterns)), tmp_path)
    assert result.status is TrialState.ERROR, trials_seen([result])
    assert "only peak memory was found in rank0.log" in result.error
    assert "the patterns of step_time_s matched no line" in result.error
    assert "no regex metric lines" not in result.error


def test_steps_per_second_and_a_scale_with_placeholders(tmp_path):
    lines = ["it/s 1.0", "it/s 2.0", "it/s 2.5", "it/s 3.5", "rate 100"]
    by_steps = regex_trainer(tmp_path, lines, {"steps_per_s": r"it/s ([0-9.]+)"})
    result, _ = run(spec(by_steps), tmp_path)
    assert result.metrics["step_time_s"] == pytest.approx(1 / 2.5)  # median of 2.0, 2.5, 3.5
    assert result.metrics["tokens_per_s"] == pytest.approx(2.5 * 4 * SEQ)
    # A rate per "batch" of the program's own, turned into tokens/s by the layout's sizes.
    scaled = regex_trainer(
        tmp_path, lines, {"tokens_per_s": {"pattern": r"rate (\d+)", "role": "summary"}},
        scale={"tokens_per_s": "{global_batch}*{seq_length}/2"},
    )  # fmt: skip
    result, _ = run(spec(scaled), tmp_path)
    assert result.metrics["tokens_per_s"] == pytest.approx(100 * 4 * SEQ / 2)


def test_a_per_step_pattern_printed_once_says_to_use_a_summary_role():
    parser = make_parser("regex", {"loss": "loss ([0-9.]+)", "samples_per_s": "sps ([0-9.]+)"})
    scan = parse_lines(["loss 3", "loss 2", "loss 1", "sps 5"], parser)
    trial = spec(validate_section({"kind": "command", "command": ["x"]}, "t"))
    with pytest.raises(Exception, match="give it role: summary"):
        summarize(scan, trial, warmup_steps=1)


@pytest.mark.parametrize(
    "keys, field, message",
    [
        ({"patterns": {"loss": {"pattern": "(1)", "role": "once"}, "tokens_per_s": "(1)"}},
         "trainer.patterns", "role: must be one of ['step', 'summary']"),
        ({"patterns": {"tokens_per_s": {"regex": "(1)"}}}, "trainer.patterns", "'pattern'"),
        ({"patterns": {"tokens_per_s": "(1)"}, "scale": {"tokens_per_s": "{seq}"}},
         "trainer.scale.tokens_per_s", "unknown placeholder {seq}"),
        ({"patterns": {"tokens_per_s": "(1)"}, "scale": {"tokens_per_s": "{seq_length}+1"}},
         "trainer.scale.tokens_per_s", "joined by * or /"),
        ({"patterns": {"tokens_per_s": "(1)"}, "scale": {"tokens_per_s": -2}},
         "trainer.scale.tokens_per_s", "positive"),
    ],
)  # fmt: skip
def test_regex_section_errors_name_the_field(keys, field, message):
    with pytest.raises(SpaceError) as caught:
        validate_section({"kind": "command", "command": ["x"], "parser": "regex", **keys}, "s")
    assert caught.value.field == field
    assert message in str(caught.value)


# --- failure reasons --------------------------------------------------------------------


def test_failure_reasons_take_the_logs_exception_and_group_alike_ones():
    from parsearch.failures import failure_reason, group_failures

    tail = "Traceback (most recent call last):\n  ...\n[rank1]: torch.OutOfMemoryError: CUDA\n"
    assert failure_reason("rank 1 exited with code 1", tail) == (
        "rank 1 exited with code 1: torch.OutOfMemoryError: CUDA"
    )
    assert failure_reason("timed out after 5 s", tail) == "timed out after 5 s"

    def record(number, state, error):
        fields = dict.fromkeys(TrialRecord.__dataclass_fields__)
        fields.update(number=number, state=state, error=error, log_tail="")
        return TrialRecord(**fields)

    groups = group_failures(
        [
            record(0, TrialState.ERROR, "rank 0 exited with code 1"),
            record(1, TrialState.OK, None),
            record(2, TrialState.ERROR, "rank 3 exited with code 1"),
            record(3, TrialState.OOM, "rank 0 ran out of memory"),
        ]
    )
    assert [(g.state, g.trials, g.reason) for g in groups] == [
        (TrialState.ERROR, (0, 2), "rank 0 exited with code 1"),
        (TrialState.OOM, (3,), "rank 0 ran out of memory"),
    ]


# --- parsearch trial: a dry run ----------------------------------------------------------


@pytest.mark.e2e
def test_a_dry_run_prints_command_metrics_state_and_log_and_stores_nothing(tmp_path):
    program = tmp_path / "program.py"
    program.write_text(
        "import sys\nmbs = int(sys.argv[1])\nprint('loss 2.5')\n"
        "print(f'samples/s {10 * mbs}')\nsys.exit(0 if mbs < 4 else 5)\n"
    )
    space = {
        "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 128,
                  "seq_length": 32},
        "allocation": {"nodes": 1, "devices_per_node": 2, "device": "cpu",
                       "device_memory": "1GiB", "peak_tflops": 0.05},
        "search": {"tp": [1, 2], "pp": 1, "mbs": [1, 2, 4], "gas": 1},
        "trainer": {"kind": "command", "parser": "regex", "launch": "single",
                    "command": [sys.executable, str(program), "{mbs}"],
                    "patterns": {"loss": "loss ([0-9.]+)", "samples_per_s": {
                        "pattern": "samples/s ([0-9.]+)", "role": "summary"}}},
    }  # fmt: skip
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))

    def dry(layout: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "parsearch", "trial", "space.yaml", "--layout", layout],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    ok = dry("tp2 pp1 mbs2 gas1")
    assert ok.returncode == 0, ok.stderr
    assert f"command  {sys.executable} {program} 2" in ok.stdout
    assert "state    ok" in ok.stdout and '"tokens_per_s": 640.0' in ok.stdout
    assert "  samples/s 20" in ok.stdout  # the log tail
    failed = dry("tp1 mbs4")
    assert failed.returncode == 1
    assert "state    error" in failed.stdout and "exited with code 5" in failed.stdout
    bad = dry("tp2 mbs3")
    assert bad.returncode == 2 and "--layout" in bad.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["program.py", "space.yaml"]


# --- launch arithmetic ------------------------------------------------------------------

# nanoGPT's train.py: gradient_accumulation_steps is the total over the DDP ranks, divided
# by the world size inside; it reports the global batch (sequences per step) it ran.
NANOGPT_BATCH = """
import json, sys
total_gas, mbs, world = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
gas = total_gas // world
print(json.dumps({"world_size": world, "global_batch": mbs * gas * world}))
print(json.dumps({"tokens_per_s": 1000.0}))
"""


@pytest.mark.parametrize("passed, ok", [("{gas_times_dp}", True), ("{gas}", False)])
def test_the_batch_a_program_reports_is_checked_against_the_layout(tmp_path, passed, ok):
    program = tmp_path / "nanogpt_batch.py"
    program.write_text(NANOGPT_BATCH)
    section = trainer(tmp_path, [], launch="single")
    section["command"] = [sys.executable, str(program), passed, "{mbs}", "{dp}"]
    result, _ = run(spec(validate_section(section, "t"), dp=2, mbs=2), tmp_path)  # gas 2
    if ok:
        assert result.ok, result.error
        return
    assert result.status is TrialState.ERROR, trials_seen([result])
    assert "reports global batch size 4 but the layout" in result.error
    assert "has global batch size 8" in result.error
