"""Small test doubles shared by several test files."""

from __future__ import annotations


class BlackBox:
    """The tiny HF model seen through a black-box engine (text in, text out; no hidden states)."""

    white_box = False
    capabilities = frozenset({"generate"})  # declared, so the inner backend's own do not show through

    def __init__(self, inner) -> None:
        self.inner = inner
        self.model_name = inner.model_name

    def __getattr__(self, name):
        return getattr(self.inner, name)


def annotated_records(n: int, start: int = 0, dataset: str = "toy"):
    """``n`` complete records (correctness, samples, consistency) with a fixed, learnable pattern."""
    from candor.annotation.records import Record
    from candor.backends.base import Completion
    from candor.data.items import QAItem

    out = []
    for i in range(start, start + n):
        item = QAItem(f"{dataset}:{i}", dataset, "train", f"What is fact number {i} about {dataset}?", ("x",))
        out.append(
            Record(
                item=item,
                greedy=Completion("x"),
                samples=[Completion("x")] * 4,
                greedy_correct=int(i % 3 == 0),
                sample_correct=[int(i % 3 == 0), 0, 1, 0],
                consistency=[1, i % 2, int(i % 3 == 0), 0],
                provenance={"template": "fewshot"},
            )
        )
    return out
