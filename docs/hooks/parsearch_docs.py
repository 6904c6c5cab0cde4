"""mkdocs hooks of parsearch's documentation site (``hooks:`` in mkdocs.yml).

* The command-line reference (``reference/cli.md``) is generated at build time from the real
  argparse parsers (:func:`parsearch.cli.build_parser`): the page holds the marker
  ``<!-- parsearch-cli-reference -->`` and every sub-command's usage, description and options
  replace it. Nothing of ``--help`` is copied by hand, so the page cannot fall behind the code.
* The benchmarks page (``benchmarks/index.md``) includes ``benchmarks/README.md`` where it
  lies (pymdownx.snippets); the files it links relatively inside ``benchmarks/`` (its figures,
  ``*.png``) are added to the site under ``benchmarks/``, so its links resolve there as they
  do in the repository.
"""

from __future__ import annotations

import argparse
import html
import os
import re
from collections.abc import Iterator
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
CLI_MARKER = "<!-- parsearch-cli-reference -->"
CLI_PAGE = "reference/cli.md"
BENCHMARKS = "benchmarks"
# Columns argparse wraps the usage lines to: fixed, so the page does not depend on a terminal.
USAGE_WIDTH = 100
# Sphinx roles in docstrings (``:class:`~a.b.C` ``), as mkdocstrings leaves them in the HTML.
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):<code>(~?)([^<]+)</code>")
_LINK = re.compile(r"\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")


# --- the command-line reference -------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-parsers of ``parser`` by name, in the order ``--help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices.items())
    return {}


def _cell(text: str) -> str:
    """``text`` safe in a Markdown table cell: HTML-escaped, pipes and newlines folded."""
    text = html.escape(" ".join(text.split()), quote=False)
    return text.replace("|", "\\|").replace("*", "\\*").replace("_", "\\_")


def _argument(action: argparse.Action, parser: argparse.ArgumentParser) -> tuple[str, str]:
    """One option or positional as a table row: its spelling and what it does."""
    formatter = parser._get_formatter()
    if action.option_strings:
        if action.nargs == 0:
            spelled = ", ".join(action.option_strings)
        else:
            metavar = formatter._format_args(
                action, formatter._get_default_metavar_for_optional(action)
            )
            spelled = ", ".join(f"{option} {metavar}" for option in action.option_strings)
    else:
        spelled = formatter._format_args(
            action, formatter._get_default_metavar_for_positional(action)
        )
    help_text = formatter._expand_help(action) if action.help else ""
    details = []
    if action.choices is not None and "{" not in spelled:  # a metavar hides the choices
        details.append("one of " + ", ".join(f"`{choice}`" for choice in action.choices))
    if action.required and action.option_strings:
        details.append("required")
    described = _cell(help_text)
    if details:
        described = f"{described} ({'; '.join(details)})" if described else "; ".join(details)
    return f"`{spelled}`", described


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = parser.formatter_class(prog=parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _groups(parser: argparse.ArgumentParser) -> Iterator[tuple[str, list[argparse.Action]]]:
    for group in parser._action_groups:
        actions = [
            a
            for a in group._group_actions
            if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
        ]
        if actions:
            yield group.title or "options", actions


def cli_reference() -> str:
    """The Markdown of the command-line reference, from the parser ``parsearch`` runs."""
    from parsearch.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(USAGE_WIDTH)  # argparse wraps by the terminal's width
    try:
        parser = build_parser()
        lines = [
            "## `parsearch`",
            "",
            _cell(parser.description or ""),
            "",
            "```text",
            _usage(parser),
            "```",
            "",
            "| command | what it does |",
            "| --- | --- |",
        ]
        helps = {
            choice.dest: choice.help
            for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
            for choice in action._choices_actions
        }
        commands = subcommands(parser)
        for name in commands:
            lines.append(f"| [`{name}`](#parsearch-{name}) | {_cell(helps.get(name) or '')} |")
        lines.append("")
        for name, sub in commands.items():
            lines += [f"## `parsearch {name}` {{#parsearch-{name}}}", ""]
            description = sub.description or helps.get(name) or ""
            if description:
                lines += [_cell(description), ""]
            lines += ["```text", _usage(sub), "```", ""]
            for title, actions in _groups(sub):
                lines += [f"**{_cell(title)}**", "", "| argument | meaning |", "| --- | --- |"]
                lines += [
                    f"| {spelled} | {meaning} |"
                    for spelled, meaning in (_argument(a, sub) for a in actions)
                ]
                lines.append("")
            if sub.epilog:
                lines += [_cell(sub.epilog), ""]
        return "\n".join(lines)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


# --- mkdocs events ---------------------------------------------------------------------------


def benchmark_files() -> list[str]:
    """Files of ``benchmarks/`` its README shows or links (repository-relative paths)."""
    folder = ROOT / BENCHMARKS
    wanted = {path.name for path in folder.glob("*.png")}
    readme = folder / "README.md"
    if readme.is_file():
        for target in _LINK.findall(readme.read_text(encoding="utf-8")):
            target = target.split("#", 1)[0]
            if not target or "://" in target or target.startswith(("/", "mailto:")):
                continue
            path = (folder / target).resolve()
            if path.is_file() and path.parent == folder and path.suffix != ".md":
                wanted.add(path.name)
    return [f"{BENCHMARKS}/{name}" for name in sorted(wanted)]


def on_files(files: Files, config) -> Files:
    for path in benchmark_files():
        if files.get_file_from_path(path) is None:
            files.append(File(path, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri == CLI_PAGE:
        if CLI_MARKER not in markdown:
            raise ValueError(f"{CLI_PAGE} lost its marker {CLI_MARKER}")
        return markdown.replace(CLI_MARKER, cli_reference())
    return markdown


def _role(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if short else target.lstrip('.')}</code>"


def on_page_content(html_text: str, page, config, files) -> str:
    """Sphinx roles left in rendered docstrings become plain code: ``:class:`~a.B` `` → ``B``."""
    return _ROLE.sub(_role, html_text)
