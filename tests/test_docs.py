"""The docs in the repository: the pages exist, the site's nav holds each, the README links them, and what cites
them resolves.

Source comments cite a page and a section (``docs/methods.md "EliCal"``); a renamed section or a
moved module would leave a reference to nothing, so both are checked here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = (
    "index.md",
    "install.md",
    "annotate.md",
    "backends.md",
    "estimators.md",
    "evaluation.md",
    "claims.md",
    "training.md",
    "diagnostics.md",
    "serving.md",
    "benchmarks.md",
    "python-api.md",
    "architecture.md",
    "methods.md",
    "engine.md",
    "development.md",
)
CITATION = re.compile(r'docs/([a-z_]+\.md)((?: "[^"]+",?)+)')


def headings(page: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("#")}


def source_files() -> list[Path]:
    """Every file that may cite the docs (this test file's own example of a bad citation left out)."""
    files = [
        *(ROOT / "src").rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "benchmarks").rglob("*.py"),
        ROOT / "benchmarks" / "README.md",
    ]
    return [path for path in files if path.resolve() != Path(__file__).resolve()]


@pytest.mark.parametrize("page", PAGES)
def test_each_page_exists_and_the_readme_links_it(page):
    assert (DOCS / page).is_file()
    if page != "index.md":  # the site's home: the README is the repository's
        assert f"](docs/{page})" in (ROOT / "README.md").read_text(), page


def nav_pages(entries) -> list[str]:
    """Every page mkdocs.yml's ``nav`` names, in order (an entry is a page, or a title over one or a list)."""
    pages = []
    for entry in entries if isinstance(entries, list) else [entries]:
        if isinstance(entry, str):
            pages.append(entry)
        else:
            for value in entry.values():
                pages.extend(nav_pages(value))
    return pages


def site_pages() -> set[str]:
    """Every Markdown page under docs/, as mkdocs names it (the hooks' folder is not a page)."""
    return {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md") if "hooks" not in path.parts}


def test_the_nav_holds_every_page_once_and_names_only_pages_that_exist():
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert len(nav) == len(set(nav)), nav
    assert set(nav) == site_pages()  # a page left out, or an entry with no page, fails
    assert set(PAGES) <= set(nav)


def test_the_site_builds_offline():
    """No web fonts and nothing from a CDN: the site reads with no network (``make docs`` builds it strictly)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["theme"]["name"] == "material" and config["theme"]["font"] is False
    assert not [url for key in ("extra_css", "extra_javascript") for url in config.get(key, []) if "//" in str(url)]


def test_every_relative_link_of_the_readme_resolves():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local
    assert [link for link in local if not (ROOT / link).exists()] == []


def test_the_site_home_carries_the_readme_opening():
    """docs/index.md repeats the README's opening (before "## A tour"), its images linked from docs/."""
    opening = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    home = (DOCS / "index.md").read_text()
    for paragraph in opening.split("\n\n"):
        assert paragraph.replace("](benchmarks/", "](../benchmarks/") in home, paragraph[:80]


def documented_objects() -> list[object]:
    """What the API pages' ``::: identifier`` blocks render: the object, or each of its listed ``members``."""
    import importlib

    def resolve(identifier: str) -> object:
        parts = identifier.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for name in parts[cut:]:
                obj = getattr(obj, name)
            return obj
        raise AssertionError(f"no module in {identifier}")

    objects = []
    for page in sorted((DOCS / "api").glob("*.md")):
        for block in re.finditer(r"^::: (\S+)\n((?:    .*\n)*)", page.read_text(), re.M):
            members = re.search(r"members: \[([^\]]*)\]", block.group(2))
            target = resolve(block.group(1))
            names = [m.strip() for m in members.group(1).split(",")] if members else []
            objects += [getattr(target, name) for name in names] if names else [target]
    return objects


def test_the_api_pages_document_every_name_of_the_front_door():
    import candor

    documented = documented_objects()
    missing = [name for name in candor._EXPORTS if not any(getattr(candor, name) is obj for obj in documented)]
    assert missing == []


def test_no_source_cites_a_file_outside_the_repository():
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in (ROOT / "src").rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "DESIGN.md" in line or "../shared" in line
    ]
    assert offenders == []


def test_every_citation_names_a_page_and_sections_that_exist():
    cited = 0
    for path in source_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for match in CITATION.finditer(line):
                page = DOCS / match.group(1)
                assert page.is_file(), f"{path}:{n}: no page {page.name}"
                for title in re.findall(r'"([^"]+)"', match.group(2)):
                    assert title in headings(page), f"{path}:{n}: {page.name} has no section {title!r}"
                    cited += 1
    assert cited > 40  # the sources do cite the pages


def test_a_citation_of_a_missing_section_is_caught():
    line = 'See docs/methods.md "EliCal", "No such section".'
    titles = re.findall(r'"([^"]+)"', CITATION.search(line).group(2))
    assert [t in headings(DOCS / "methods.md") for t in titles] == [True, False]


def test_every_module_the_docs_name_exists():
    named = {name for page in PAGES for name in re.findall(r"`(candor(?:\.[a-z_]+)+)", (DOCS / page).read_text())}
    assert named
    missing = []
    for name in sorted(named):
        parts = name.split(".")
        # ``candor.a.b.Name``: the longest prefix that is a module or package must leave at most one name.
        for cut in range(len(parts), 0, -1):
            base = ROOT / "src" / Path(*parts[:cut])
            if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
                break
        if len(parts) - cut > 1 or cut == 1 and len(parts) > 2:
            missing.append(name)
    assert missing == []
