"""``shell: true`` templates: a filled value is one word whatever it holds, and a placeholder
the template itself quotes (where quoting cannot protect it) is refused at load time."""

from __future__ import annotations

import string
import subprocess

import pytest

from parsearch.trainers.command.template import CommandTemplate, TemplateError

HOSTILE = [
    "$(touch pwned)",
    "`touch pwned`",
    "; touch pwned",
    "&& touch pwned",
    "| touch pwned",
    "a'b\"c",
    "'; touch pwned; '",
    '"; touch pwned; "',
    '\\"$(touch pwned)\\"',
    "${IFS}touch${IFS}pwned",
    "* ? [a] ~ #x",
    "> pwned",
    "< /dev/null",
    "\ntouch pwned\n",
    "$HOME",
    "",
    " leading and trailing ",
    string.punctuation,
]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_filled_value_is_one_word_of_the_shell(value, tmp_path):
    template = CommandTemplate.parse("printf '<%s>' {v} && printf '|%s|' {v}", {"v"}, shell=True)
    argv = template.argv({"v": value})
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert done.stdout == f"<{value}>|{value}|"
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "command",
    [
        'echo "{v}"',
        "echo '{v}'",
        'echo "prefix {v} suffix"',
        "echo --flag='{v}'",
        "echo \\{v}",
        "echo \"a'b\" '{v}'",
    ],
)
def test_a_placeholder_inside_the_templates_quotes_is_refused(command):
    with pytest.raises(TemplateError, match=r"placeholder \{v\} is (inside|after).*remove"):
        CommandTemplate.parse(command, {"v"}, shell=True)


@pytest.mark.parametrize(
    "command", ['echo "literal" {v}', "echo 'it''s' {v} \"x\"", 'echo \\"{v}', "echo $( echo {v} )"]
)
def test_quotes_elsewhere_in_the_command_are_fine(command, tmp_path):
    template = CommandTemplate.parse(command, {"v"}, shell=True)
    done = subprocess.run(
        template.argv({"v": "$(touch pwned)"}), cwd=tmp_path, capture_output=True, text=True
    )
    assert "$(touch pwned)" in done.stdout
    assert not (tmp_path / "pwned").exists()
