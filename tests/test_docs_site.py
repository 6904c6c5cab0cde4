"""The documentation site (docs/, mkdocs.yml) and the READMEs that point into it.

The site is built once, strictly (``mkdocs build --strict``: any warning, a broken link or
anchor among them, fails), into a temporary directory; then every relative link and image of
every built page must resolve to a file of the site (and its ``#anchor`` to an id of that
page), every relative link of README.md, jobs/README.md and search_spaces/examples/README.md
to a file of the repository, and external links must be well-formed (they are not fetched:
the test runs offline). Every page is a file (``a/b.html``) and every link points to one, so
the site reads from its files as well as served: opened from ``file://``, a link to a
directory shows the directory's listing; and its search works from files (in headless
Chromium). The command-line reference, generated from the parsers when the site
is built, must hold every sub-command and option of the real parser.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from parsearch.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
# READMEs of the repository whose links are checked here (benchmarks/README.md is checked by
# the strict build, which includes it in the site).
READMES = ["README.md", "jobs/README.md", "search_spaces/examples/README.md"]
MAX_README_LINES = 250
# The two commands of README.md, exactly: .ci/run runs the second.
DEMO_COMMAND = "bash scripts/demo.sh"
TEST_COMMAND = "bash scripts/test.sh"
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
AUTOLINK = re.compile(r"<(https?://[^>\s]+)>")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built with ``mkdocs build --strict`` into a temporary directory."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner, not a warning
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    assert "WARNING" not in log, log
    return out


class _Page(HTMLParser):
    """The ids of an HTML page and the URLs its elements point to."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name"):
                self.ids.add(value)
            elif name in ("href", "src") and not (tag == "a" and name == "src"):
                self.urls.append(value)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _well_formed_external(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in ("http", "https"):
        return bool(parts.netloc) and " " not in url
    return parts.scheme == "mailto" and "@" in parts.path


def _site_target(site: Path, page: Path, url: str) -> tuple[Path, str]:
    """The file of the site a relative ``url`` on ``page`` points to, and its fragment."""
    parts = urlsplit(url)
    target = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
    return target, unquote(parts.fragment)


def test_site_links_and_images_resolve(site: Path) -> None:
    pages = {path.resolve(): _parse(path) for path in site.rglob("*.html")}
    assert len(pages) >= 10, sorted(pages)
    broken = []
    for path, page in pages.items():
        if path.name == "404.html":  # served for any URL, so its links are site-absolute
            continue
        for url in page.urls:
            where = f"{path.relative_to(site.resolve())}: {url}"
            if urlsplit(url).scheme or url.startswith("//"):
                if not _well_formed_external(url):
                    broken.append(f"{where} (malformed external link)")
                continue
            if url.startswith("/"):
                broken.append(f"{where} (absolute: breaks when the site is not at /)")
                continue
            target, fragment = _site_target(site, path, url)
            if target.is_dir():
                broken.append(f"{where} (a directory: opened from files, it shows a listing)")
            elif not target.is_file():
                broken.append(f"{where} (no such file)")
            elif fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if fragment not in ids:
                    broken.append(f"{where} (no anchor #{fragment})")
    assert not broken, "\n".join(broken)


def _markdown_links(text: str) -> list[str]:
    """Link and image targets of a Markdown text, outside fenced code blocks."""
    prose = re.sub(r"(?ms)^```.*?^```", "", text)
    return MARKDOWN_LINK.findall(prose) + AUTOLINK.findall(prose)


def _doc_page(site: Path, doc: Path) -> Path | None:
    """The built page of a Markdown file under docs/ (``docs/a/b.md`` → ``a/b.html``);
    ``None`` for a file the site does not build."""
    if not doc.is_relative_to(ROOT / "docs") or doc.suffix != ".md":
        return None
    return site / doc.relative_to(ROOT / "docs").with_suffix(".html")


@pytest.mark.parametrize("readme", READMES)
def test_readme_links_resolve(site: Path, readme: str) -> None:
    path = ROOT / readme
    broken = []
    for url in _markdown_links(path.read_text(encoding="utf-8")):
        if urlsplit(url).scheme:
            if not _well_formed_external(url):
                broken.append(f"{url} (malformed external link)")
            continue
        parts = urlsplit(url)
        target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
        if not target.exists():
            broken.append(f"{url} (no such file in the repository)")
            continue
        if not target.resolve().is_relative_to(ROOT):
            broken.append(f"{url} (outside the repository)")
            continue
        if parts.fragment:
            built = _doc_page(site, target)
            if built is None:
                broken.append(f"{url} (an anchor into a file the site does not build)")
            elif unquote(parts.fragment) not in _parse(built).ids:
                broken.append(f"{url} (no anchor #{parts.fragment} in the built page)")
    assert not broken, f"{readme}:\n" + "\n".join(broken)


def test_readme_is_short_and_keeps_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES
    block = re.search(r"(?ms)^## Two commands$.*?^```bash\n(.*?)^```", text)
    assert block, "README.md lost its 'Two commands' section"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    assert commands == [DEMO_COMMAND, TEST_COMMAND]
    # CI runs the README's test command: .ci/run execs exactly the script it names.
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8")
    assert re.search(r"(?m)^exec bash scripts/test\.sh\s*$", ci), ci
    for command in (DEMO_COMMAND, TEST_COMMAND):
        assert (ROOT / command.split()[-1]).is_file()
    assert ".venv/bin/mkdocs serve" in text


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    return dict(actions[0].choices)


def test_cli_reference_holds_every_subcommand_and_option(site: Path) -> None:
    page = site / "reference" / "cli.html"
    html_text = page.read_text(encoding="utf-8")
    ids = _parse(page).ids
    commands = _subcommands()
    assert len(commands) >= 13, sorted(commands)
    missing = []
    for name, sub in commands.items():
        if f"parsearch-{name}" not in ids:
            missing.append(f"section of `parsearch {name}`")
            continue
        # The section of this command: from its heading to the next command's.
        section = html_text.split(f'id="parsearch-{name}"', 1)[1].split('<h2 id="parsearch-', 1)[0]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            spellings = action.option_strings or [action.metavar or action.dest]
            missing += [
                f"`parsearch {name}` {spelled}"
                for spelled in spellings
                if f"<code>{spelled}" not in section
            ]
    assert not missing, "the CLI reference lacks:\n" + "\n".join(missing)


def test_api_page_documents_the_public_api(site: Path) -> None:
    text = (site / "reference" / "api.html").read_text(encoding="utf-8")
    for name in (
        "parsearch.space.load_space",
        "parsearch.query.results",
        "parsearch.campaign.api.run_campaign",
        "parsearch.store.open_store",
        "parsearch.store.Store",
        "parsearch.trainer_flags.export",
        "parsearch.report.write_report",
    ):
        assert f'id="{name}"' in text, name


def test_benchmarks_page_includes_the_benchmarks_readme_with_its_figures(site: Path) -> None:
    readme = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    page = site / "benchmarks" / "index.html"
    text = page.read_text(encoding="utf-8")
    headings = re.findall(r"(?m)^## (.+)$", readme)
    assert headings
    words = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())
    for heading in headings:
        plain = " ".join(re.sub(r"[`*_]", "", heading).split("—")[0].split())
        assert plain in words, f"the benchmarks page lacks the section {heading!r}"
    # Its figures are in the site beside the page, as they are beside the README.
    images = [i for i in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", readme) if "://" not in i]
    assert images, "benchmarks/README.md shows no figure"
    for image in images:
        assert (page.parent / image).resolve().is_file(), image
    assert text.count("<img ") >= len(images)


# Types a word into the theme's search box as a person would (focus, then input and keyup
# events that bubble to where the theme listens), and counts the results listed.
SEARCH_FOR = """(() => {
  const box = document.querySelector("input[data-md-component=search-query]");
  box.focus();
  box.value = WORD;
  box.dispatchEvent(new Event("input", { bubbles: true }));
  box.dispatchEvent(new KeyboardEvent("keyup", { bubbles: true, key: "g" }));
  return document.querySelectorAll(".md-search-result__item").length > 0;
})()"""


@pytest.mark.e2e
def test_the_site_searches_from_its_files(site: Path) -> None:
    """Opened as ``file://.../index.html``, with no server: the search index loads (as a
    script) and the search runs (its worker through the site's own stand-in)."""
    from headless_chromium import browser, find_browser

    chromium = find_browser()
    if chromium is None:
        pytest.skip("no Chromium here: .ci/run installs Debian's chromium package")
    url = (site / "guide" / "store.html").as_uri()
    ready = "document.readyState === 'complete'"
    with browser(chromium) as opened, opened.page(url, 1280, 900, ready=ready) as page:
        deadline = time.monotonic() + 30  # the index loads in well under a second
        while not page.evaluate(SEARCH_FOR.replace("WORD", '"fencing"')):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        meta = page.evaluate(
            "(document.querySelector('.md-search-result__meta') || {}).textContent"
        )
        found = page.evaluate(
            "[...document.querySelectorAll('.md-search-result__item a')].map(a => a.href)"
        )
        console = page.console()
    assert not console, console
    assert found, f"no search results from files; the search said {meta!r}"
    # Each result opens a page of the site, a file.
    pages = {Path(unquote(urlsplit(link).path)) for link in found}
    assert all(page.suffix == ".html" and page.is_file() for page in pages), found
