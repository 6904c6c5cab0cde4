"""``shell: true`` templates: every filled value reaches the shell as data, under dash and bash.

No value is ever written into the script: each placeholder becomes a reference to a variable
the shell receives as a positional parameter, so wherever the template puts it (a comment
holding a quote, a here-document, backquotes, ``$(...)``, the template's own quotes) a shell
never parses it. The cases of issue 29 (each walked around the old quote check) come first.
"""

from __future__ import annotations

import os
import string
import subprocess
from pathlib import Path

import pytest

from parsearch.trainers.command.template import CommandTemplate

SHELLS = [shell for shell in ("/bin/dash", "/bin/bash") if os.path.exists(shell)]

# Values that would run `touch pwned` (or break out of any quoting) if a shell parsed them.
HOSTILE = [
    "$(touch pwned)",
    "`touch pwned`",
    "; touch pwned",
    "&& touch pwned",
    "| touch pwned",
    "a'b\"c",
    "'; touch pwned; '",
    '"; touch pwned; "',
    '"$(touch pwned)"',
    "'$(touch pwned)'",
    '\\"$(touch pwned)\\"',
    "`touch pwned`$(touch pwned)'\"`",
    "`;touch pwned;`",
    '" `touch pwned` "',
    "${IFS}touch${IFS}pwned",
    "* ? [a] ~ #x",
    "> pwned",
    "< /dev/null",
    "\ntouch pwned\n",
    "EOF\ntouch pwned\nEOF",
    "$HOME",
    "",
    " leading and trailing ",
    "a[$(touch pwned)]",
    string.punctuation,
]

# (template, what printf receives for a value v, or None where only safety is asserted).
# `printf '<%s>'` shows each argument it got, so the output tells how many words v became.
TEMPLATES = [
    ("printf '<%s>' {v}", "<{v}>"),
    ("printf '<%s>' {v} && printf '|%s|' {v}", "<{v}>|{v}|"),
    # Issue 29 (a): a double quote in a comment put the old check out of step with the shell.
    ('# say "hi\nprintf \'<%s>\' "{v}"', "<{v}>"),
    ("# it's\nprintf '<%s>' '{v}'", "<{v}>"),
    ('printf \'<%s>\' "{v}" # "', "<{v}>"),
    # The template's own quotes, refused before; now filled as data.
    ("printf '<%s>' \"{v}\"", "<{v}>"),
    ("printf '<%s>' \"prefix {v} suffix\"", "<prefix {v} suffix>"),
    ("printf '<%s>' '{v}'", "<{v}>"),
    ("printf '<%s>' --flag='{v}'", "<--flag={v}>"),
    ("printf '<%s>' \"a'b\" '{v}'", "<a'b><{v}>"),
    # Issue 29 (b): a here-document's body (the shell expands $(...) there).
    ("cat <<EOF\n<{v}>\nEOF", "<{v}>\n"),
    ("cat <<-EOF\n\t<{v}>\n\tEOF", "<{v}>\n"),
    ('cat <<"EOF"\n<{v}>\nEOF', None),
    ("cat <<EOF; printf '<%s>' {v}\n{v}\nEOF", None),
    # Issue 29 (c): backquotes, where dash refuses a backquote in the value and bash runs it.
    ("printf '<%s>' `printf %s {v}`", None),
    ("printf '<%s>' \"`printf %s {v}`\"", None),
    ("printf '<%s>' $(printf %s {v})", None),
    ("printf '<%s>' \"$(printf '%s' {v})\"", None),
    ("printf '<%s>' \"$(printf '%s' \"{v}\")\"", None),
    # Backslashes, parameter expansions, subshells, functions.
    ("printf '<%s>' \\{v}", None),
    ("printf '<%s>' \\\"{v}", None),
    ("printf '<%s>' ${{UNSET:-{v}}}", None),
    ("printf '<%s>' \"${{UNSET:-{v}}}\"", None),
    ("(printf '<%s>' {v})", "<{v}>"),
    ("f() {{ printf '<%s>' \"$1\"; }}; f {v}", "<{v}>"),
    ("set -- x y; printf '<%s>' {v} \"$#\"", "<{v}><2>"),
]


def _run(template: str, value: str, shell: str, cwd: Path) -> subprocess.CompletedProcess:
    argv = CommandTemplate.parse(template, {"v"}, shell=True).argv({"v": value}, shell=shell)
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(("template", "expected"), TEMPLATES, ids=lambda v: repr(v)[:40])
def test_no_value_runs_as_a_command_wherever_the_template_puts_it(
    shell, template, expected, tmp_path
):
    """Every hostile value in every template shape (one test per shape and shell)."""
    for value in HOSTILE:
        done = _run(template, value, shell, tmp_path)
        assert list(tmp_path.iterdir()) == [], (value, done.stdout, done.stderr)
        if expected is not None:
            assert done.returncode == 0, (value, done.stderr)
            assert done.stdout == expected.replace("{v}", value), value


@pytest.mark.parametrize("shell", SHELLS)
def test_the_issues_three_walk_arounds_end_as_data(shell, tmp_path):
    """The exact shapes of issue 29: each ran `touch` through the old quote check."""
    cases = [
        ('# say "hi\necho "{v}"', "$(touch pwned)"),  # (a) both shells ran it before
        ("cat <<EOF\n{v}\nEOF", "$(touch pwned)"),  # (b) both shells ran it before
        ("echo `echo {v}`", "`;touch pwned;`"),  # (c) bash ran it before, dash refused
    ]
    for template, value in cases:
        done = _run(template, value, shell, tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout == value + "\n"
        assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_values_are_exported_for_the_programs_the_template_starts(shell, tmp_path):
    """A quoted here-document read by another shell, or a program's own environment, finds
    the value there, the safe way to hand a value to code."""
    template = "sh <<'EOF'\nprintf '<%s>' \"$PARSEARCH_V\"\nEOF\nprintenv PARSEARCH_TP"
    argv = CommandTemplate.parse(template, {"v", "tp"}, shell=True).argv(
        {"v": "$(touch pwned)", "tp": 4}, shell=shell
    )
    # {tp} is not in the template: only the placeholders it names are passed.
    assert "4" not in argv[3:]
    template += " {tp} # and {v}: named anywhere, a placeholder is exported"
    argv = CommandTemplate.parse(template, {"v", "tp"}, shell=True).argv(
        {"v": "$(touch pwned)", "tp": 4}, shell=shell
    )
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert not (tmp_path / "pwned").exists()
    assert done.stdout.startswith("<$(touch pwned)>")


def test_the_script_never_holds_a_value():
    template = CommandTemplate.parse("run --data={v} --tp {tp} # {v}", {"v", "tp"}, shell=True)
    argv = template.argv({"v": "SECRET-VALUE", "tp": 3})
    assert argv[:2] == ["/bin/sh", "-c"]
    assert "SECRET-VALUE" not in argv[2]
    assert argv[3:] == ["/bin/sh", "SECRET-VALUE", "3"]


def test_many_placeholders_reach_past_the_ninth_parameter(tmp_path):
    names = [f"v{i}" for i in range(12)]
    template = "printf '<%s>' " + " ".join("{" + name + "}" for name in names)
    argv = CommandTemplate.parse(template, set(names), shell=True).argv(
        {name: f"x{i}" for i, name in enumerate(names)}
    )
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert done.stdout == "".join(f"<x{i}>" for i in range(12))


@pytest.mark.parametrize(
    ("template", "advice"),
    [
        ("echo {v}", None),
        ('echo "{v}"', None),
        ("echo '{v}'", None),
        ("echo \\{v}", "follows a backslash"),
        ("cat <<EOF\n{v}\nEOF", "here-document: its value is written"),
        ("cat <<'EOF'\n{v}\nEOF", "quoted delimiter"),
        ("echo $(( {v} + 1 ))", "arithmetic"),
        ("echo $(( {tp} + 1 ))", None),
        ("cat <<EOF\n{tp}\nEOF", None),  # a number is no code, in a document or not
        ("eval echo {v}", "follows eval"),
    ],
)
def test_where_a_placeholder_sits_earns_advice_never_a_refusal(template, advice):
    parsed = CommandTemplate.parse(template, {"v", "tp"}, shell=True)
    if advice is None:
        assert parsed.advice == ()
    else:
        assert any(advice in note for note in parsed.advice), parsed.advice
        assert all(note.startswith("trainer.command: ") for note in parsed.advice)


def test_two_placeholders_that_share_a_variable_are_refused():
    from parsearch.trainers.command.template import TemplateError

    with pytest.raises(TemplateError, match=r"\{TP\}.*PARSEARCH_TP|\{tp\}.*PARSEARCH_TP"):
        CommandTemplate.parse("echo {tp} {TP}", {"tp", "TP"}, shell=True)
