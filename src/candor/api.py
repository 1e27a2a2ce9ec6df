"""The front door: a few calls that cover the usual job, re-exported as ``candor.*``.

    import candor
    records = candor.annotate("starter", "runs/starter.jsonl", limit=20)
    print(candor.evaluate(candor.score(records, ["n-prob", "consis-lex"])).markdown())

Each call is a thin layer over the stage that owns the work (``annotation``,
``estimators``), so anything here can also be done piece by piece; ``candor.evaluate`` is the
evaluation stage's own :func:`candor.evaluation.summary.evaluate`.
A model may be given by name (loaded once, here) or as a loaded backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from candor.annotation.records import Record, read_records
from candor.backends import DEFAULT_MODEL, Backend, load_backend
from candor.estimators.confidences import ConfidenceTable


def load_model(model: str = DEFAULT_MODEL, *, backend: str = "hf", **kwargs: Any) -> Backend:
    """A model by name (the embedded default, a hub id or a local folder) on a backend (``hf`` by default)."""
    return load_backend(model, backend, **kwargs)


def _backend(model: str | Backend | None) -> Backend | None:
    return load_model(model) if isinstance(model, str) else model


def annotate(
    data: str | Path,
    out: str | Path,
    *,
    model: str | Backend = DEFAULT_MODEL,
    k: int = 5,
    limit: int | None = None,
    template: str = "auto",
    data_dir: str | Path | None = None,
    **config: Any,
) -> list[Record]:
    """Answer a dataset (a name from ``candor datasets`` or a file) greedily and ``k`` times; judged records.

    Records go to ``out`` as they are made and a rerun resumes there. ``config``
    holds further :class:`candor.annotation.builder.AnnotateConfig` fields (judges, seed, batch size).
    """
    from candor.annotation.builder import AnnotateConfig
    from candor.annotation.builder import annotate as run_annotate
    from candor.annotation.prompts import resolve_template
    from candor.data import load_items

    backend = _backend(model)
    items = load_items(str(data), data_dir=data_dir, limit=limit)
    qa_template = resolve_template(template, backend.model_name, backend)
    result = run_annotate(items, backend, out, qa_template, AnnotateConfig(k=k, **config))
    wanted = {item.id for item in items}
    return [r for r in read_records(result.path) if r.id in wanted]


def score(
    records: Sequence[Record] | str | Path,
    methods: Iterable[str],
    *,
    model: str | Backend | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> ConfidenceTable:
    """One confidence column per estimator name; ``model`` is needed by the model-based ones."""
    from candor.estimators import score_records

    recs = read_records(records) if isinstance(records, str | Path) else list(records)
    return score_records(recs, list(methods), _backend(model), options=options)


class EliCal:
    """EliCal shaped like a scikit-learn estimator: ``EliCal(model).fit(records).predict(questions)``.

    ``fit`` trains a confidence head on annotated records (stage 1 on their
    consistency rates, stage 2 on ``budget`` of their labels, a number or ``"all"``; docs/methods.md "EliCal")
    with early stopping on ``dev`` (default: a slice carved from ``records``).
    ``predict`` gives one confidence per question before any answer exists.
    ``settings`` are :class:`candor.train.elical.EliCalConfig` fields (``mode``, ``layer``, ...).
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        method: str = "elical",
        budget: int | str = "all",
        out_dir: str | Path | None = None,
        seed: int = 0,
        **settings: Any,
    ) -> None:
        from candor.train.elical import Budget

        self.model, self.method, self.seed = model, method, seed
        self.budget = Budget.parse(budget)  # parsed here, where it was typed: a bad budget fails before fit
        self.out_dir = out_dir
        self.settings = settings
        self.head_: Any = None
        self.result_: Any = None

    def fit(self, records: Sequence[Record] | str | Path, dev: Sequence[Record] | str | Path | None = None) -> EliCal:
        import tempfile

        from candor.train.elical import EliCalConfig, TrainingPool, train_elical

        pool = read_records(records) if isinstance(records, str | Path) else list(records)
        dev_records = read_records(dev) if isinstance(dev, str | Path) else dev
        data = TrainingPool.of(pool, dev_records, seed=self.seed)
        out_dir = self.out_dir or tempfile.mkdtemp(prefix="candor-elical-")
        config = EliCalConfig(model=self.model, seed=self.seed, **self.settings)
        self.result_ = train_elical(
            data.pool, data.dev, method=self.method, config=config, out_dir=out_dir, budget=self.budget
        )
        self.head_ = self.result_.model
        return self

    def predict(self, questions: Sequence[str | Record]) -> Any:
        """Confidence in [0, 1] per question (or record), as a numpy array."""
        if self.head_ is None:
            from candor.util.errors import CandorError

            raise CandorError("EliCal: call fit(records) or EliCal.from_pretrained(folder) before predict")
        return self.head_.predict(list(questions))

    def save_pretrained(self, folder: str | Path) -> Path:
        return self.head_.save_pretrained(folder)

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> EliCal:
        from candor.train.elical import ConfidenceHead

        head = ConfidenceHead.from_pretrained(folder)
        out = cls(head.config.backbone)
        out.head_ = head
        return out
