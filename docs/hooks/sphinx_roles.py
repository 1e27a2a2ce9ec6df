"""Griffe extension for the API pages: the docstrings' Sphinx roles shown as code.

candor's docstrings name other objects with Sphinx roles (``:class:`~candor.serve.model.HonestModel```,
``:mod:`candor.api```). Markdown has no such roles, so they would show as literal text; here each
becomes a code span of its target (the last part only after ``~``, as Sphinx shows it), and an RST
literal-block marker (a paragraph ending in ``::``) ends in one colon.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|mod|func|meth|attr|data|exc|obj|const):`(?P<tilde>~?)(?P<target>[^`]+)`")
LITERAL = re.compile(r"::\n\n")


def _code(match: re.Match[str]) -> str:
    target = match["target"]
    return f"`{target.rsplit('.', 1)[-1] if match['tilde'] else target}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = LITERAL.sub(":\n\n", ROLE.sub(_code, obj.docstring.value))
