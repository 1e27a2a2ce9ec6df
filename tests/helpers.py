"""Small test doubles shared by several test files."""

from __future__ import annotations


class BlackBox:
    """The tiny HF model seen through a black-box engine (text in, text out; no hidden states)."""

    white_box = False

    def __init__(self, inner) -> None:
        self.inner = inner
        self.model_name = inner.model_name

    def __getattr__(self, name):
        return getattr(self.inner, name)
