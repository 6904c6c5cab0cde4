"""What a trainer printed is shown without its escape sequences (issue 29): ``show``,
``status``, ``top``, ``trial`` and the report never pass a title change, a screen clear, an
OSC 52 clipboard write or a bidirectional override to the terminal; the store and the log on
disk keep the raw text."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
import yaml

from parsearch.cli import main
from parsearch.failures import failure_reason
from parsearch.sanitize import shown, shown_line

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "search_spaces" / "tiny-cpu.yaml")

# What a hostile (or merely colourful) trainer prints, and what may be shown of it.
HOSTILE_OUTPUT = [
    ("\x1b]0;owned title\x07hello", "hello"),
    ("\x1b]2;title\x1b\\after", "after"),
    ("\x1b[2J\x1b[Hcleared", "cleared"),
    ("\x1b]52;c;cm0gLXJmIH4=\x07clipboard", "clipboard"),
    ("keep\x1b[1K\x1b[2Kerased", "keeperased"),
    ("red \x1b[1;31mtext\x1b[0m", "red text"),
    ("evil\u202etxt.exe", "evil<U+202E>txt.exe"),
    ("\u2066isolate\u2069", "<U+2066>isolate<U+2069>"),
    ("mark\u200f\u200e", "mark<U+200F><U+200E>"),
    ("zero\u200bwidth", "zero<U+200B>width"),
    ("tab\tkept\nnewline kept", "tab\tkept\nnewline kept"),
    ("bell\x07 and backspace\x08\x08", "bell and backspace"),
    ("progress 10%\rprogress 100%", "progress 10%\nprogress 100%"),
    ("windows\r\nline", "windows\nline"),
    ("\x1bP1$qm\x1b\\device control", "device control"),
    ("\x1b_application\x1b\\program command", "program command"),
    ("\x9b31m8-bit CSI", "8-bit CSI"),
    ("\x9d0;8-bit OSC\x9cafter", "after"),
    ("\x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\", "link"),
    ("cut tail \x1b]0;unterminated title", "cut tail "),
    ("charset \x1b(0switch", "charset switch"),
    ("nul\x00 and del\x7f", "nul and del"),
    ("ünïcödé, 中文, emoji 🙂", "ünïcödé, 中文, emoji 🙂"),
]
_FORBIDDEN = (
    set(chr(c) for c in range(0x20) if chr(c) not in "\n\t")
    | {chr(c) for c in range(0x7F, 0xA0)}
    | {"\u202e", "\u2066", "\u2069", "\u200f", "\u200e", "\u200b"}
)


@pytest.mark.parametrize(("raw", "expected"), HOSTILE_OUTPUT, ids=repr)
def test_escape_sequences_go_and_invisible_characters_show(raw, expected):
    assert shown(raw) == expected
    assert not _FORBIDDEN & set(shown(raw))
    assert "\n" not in shown_line(raw)


def test_a_failure_reason_is_one_clean_line():
    error = "rank 0 exited with code 1"
    tail = "step 1\n\x1b]0;pwned\x07ValueError: bad \x1b[31mvalue\x1b[0m\u202e"
    assert failure_reason(error, tail) == (
        "rank 0 exited with code 1: ValueError: bad value<U+202E>"
    )


HOSTILE_TAIL = "".join(raw + "\n" for raw, _ in HOSTILE_OUTPUT)


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory) -> Path:
    """A finished simulate campaign whose trials then hold what a hostile trainer wrote."""
    db = tmp_path_factory.mktemp("sanitize") / "s.db"
    argv = ["run", TINY, "--store", str(db), "--budget", "3", "--backend", "simulate"]
    assert main([*argv, "--quiet"]) == 0
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE trials SET state = 'error', error = ?, log_tail = ?, objective = NULL "
            "WHERE number = 1",
            ("rank 0 exited with code 1", HOSTILE_TAIL),
        )
        conn.execute(
            "UPDATE trials SET log_tail = ?, error = ? WHERE number = 0",
            (HOSTILE_TAIL, "note \x1b]52;c;ZXZpbA==\x07 from the trainer"),
        )
    return db


def _clean(text: str) -> None:
    assert not _FORBIDDEN & set(text), sorted(_FORBIDDEN & set(text))


@pytest.mark.e2e
@pytest.mark.parametrize(
    "argv",
    [
        ["show", "--trial", "0", "--lines", "100"],
        ["show", "--trial", "1", "--lines", "100"],
        ["show", "--trial", "1", "--format", "json"],
        ["status"],
        ["status", "--format", "json"],
        ["top"],
    ],
)
def test_the_commands_show_no_escape_sequence(hostile_store, capsys, argv):
    assert main([*argv[:1], "--store", str(hostile_store), *argv[1:]]) == 0
    out = capsys.readouterr().out
    _clean(out)
    if argv[0] == "show" and "json" not in argv:
        assert "evil<U+202E>txt.exe" in out and "clipboard" in out
    if argv[0] == "status" and "json" not in argv:
        assert "rank 0 exited with code 1" in out
    # The store keeps the raw text.
    with sqlite3.connect(hostile_store) as conn:
        tail = conn.execute("SELECT log_tail FROM trials WHERE number = 1").fetchone()[0]
    assert tail == HOSTILE_TAIL


@pytest.mark.e2e
def test_the_report_shows_no_escape_sequence(hostile_store, tmp_path):
    out = tmp_path / "report"
    assert main(["report", "--store", str(hostile_store), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    _clean(page)


@pytest.mark.e2e
def test_trial_shows_the_trainers_output_clean_and_keeps_the_raw_log(tmp_path, capsys):
    program = tmp_path / "noisy.py"
    program.write_text(
        "import sys\n"
        f"sys.stdout.write({HOSTILE_TAIL!r})\n"
        "raise SystemExit('\\x1b]0;title\\x07fatal \\u202eerror')\n"
    )
    space = {
        "name": "noisy",
        "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 128,
                  "seq_length": 32},
        "allocation": {"nodes": 1, "devices_per_node": 1, "device": "cpu",
                       "device_memory": "1GiB", "peak_tflops": 0.05},
        "search": {"tp": 1, "pp": 1, "mbs": 1, "gas": 1},
        "trainer": {"kind": "command", "parser": "json", "timeout": 60,
                    "command": [sys.executable, str(program)]},
    }  # fmt: skip
    path = tmp_path / "noisy.yaml"
    path.write_text(yaml.safe_dump(space))
    workdir = tmp_path / "work"
    argv = ["trial", str(path), "--layout", "tp1 pp1 mbs1 gas1", "--workdir", str(workdir)]
    code = main([*argv, "--lines", "100"])
    out = capsys.readouterr().out
    assert code == 1
    _clean(out)
    assert "evil<U+202E>txt.exe" in out
    logs = list(workdir.rglob("*.log"))
    assert any("\x1b]52;c;" in log.read_text(errors="replace") for log in logs)


def test_json_outputs_escape_what_they_carry():
    """JSON documents escape control and non-ASCII characters (ensure_ascii): safe too."""
    text = json.dumps({"log_tail": HOSTILE_TAIL})
    _clean(text)
