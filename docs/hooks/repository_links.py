"""MkDocs hook: what a page links outside docs/ (the repository's images, sources, benchmarks).

The pages are read in the repository as well as on the site, so a link to a file outside docs/ is
its path relative to the page (``../benchmarks/results/selective.png``, ``../src/candor/serve/``).
MkDocs builds docs/ only and would report each such link as not found. Here:

- an image outside docs/ is copied into the site under ``repository/`` and the link points at the copy;
- a link to another file or folder that exists (a source file, ``benchmarks/README.md``) keeps its
  text and loses the link, since the site holds no sources;
- a link to nothing is left as it is, so ``mkdocs build --strict`` still fails on it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<href>(?:\.\./)+[^)\s#]*)(?P<anchor>#[^)\s]*)?\)")
IMAGES = {".png", ".svg", ".jpg", ".jpeg", ".gif", ".webp"}
COPIES = "repository"


def _outside(config, src_uri: str, href: str) -> Path | None:
    """The existing repository file or folder outside docs/ that ``href`` on page ``src_uri`` names."""
    docs = Path(config.docs_dir).resolve()
    root = docs.parent
    target = (docs / posixpath.dirname(src_uri) / href).resolve()
    if target.is_relative_to(docs) or not target.is_relative_to(root) or not target.exists():
        return None
    return target


def on_files(files, config):
    """Every image a page links outside docs/ joins the site's files, under ``repository/``."""
    docs = Path(config.docs_dir).resolve()
    for page in files.documentation_pages():
        for match in LINK.finditer(Path(page.abs_src_path).read_text(encoding="utf-8")):
            target = _outside(config, page.src_uri, match["href"])
            if target is None or target.suffix.lower() not in IMAGES:
                continue
            uri = f"{COPIES}/{target.relative_to(docs.parent).as_posix()}"
            if files.get_file_from_path(uri) is None:
                files.append(File.generated(config, uri, abs_src_path=str(target)))
    return files


def on_page_markdown(markdown, page, config, files):
    """Links outside docs/: images to their copies, other existing targets to plain text."""
    docs = Path(config.docs_dir).resolve()

    def relink(match: re.Match[str]) -> str:
        target = _outside(config, page.file.src_uri, match["href"])
        if target is None:
            return match[0]
        if target.is_file() and target.suffix.lower() in IMAGES:
            uri = f"{COPIES}/{target.relative_to(docs.parent).as_posix()}"
            href = posixpath.relpath(uri, posixpath.dirname(page.file.src_uri) or ".")
            return f"{match['bang']}[{match['text']}]({href})"
        return match["text"]

    return LINK.sub(relink, markdown)
