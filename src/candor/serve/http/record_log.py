"""Every served question into the store (``--store URL``), and as one JSONL line with ``--log-records FILE``.

The store (:class:`~candor.annotation.served_store.ServedStore`) is what feedback,
``candor label`` and ``candor adapt`` read; the file is an export. Each line (and
each stored record) is a :class:`~candor.annotation.records.Record` (``read_records``
reads the file back): the question, the greedy answer the confidence was
computed for, the method's samples, and in ``provenance`` the model, template
and decoding they were made with plus ``served``: the confidence object each
choice got, the texts returned and, with ``--claims``, each claim's text
(a removed claim's too, which no client is sent). Such a file can be re-scored, judged
against gold answers later (``candor rejudge``) and used as a calibration set.
``served.id`` is the response id a client saw and ``served.indexes`` the choices
the record's answers fill in it, so a label sent later (``POST /v1/feedback``)
finds its record. Per choice the store also keeps whether it was answered, the
text it returned, and whether that text is the one the confidence scored
(``scores_returned_text``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from candor.annotation.records import Record
from candor.annotation.served_store import RememberedChoice, ServedChoice, ServedStore
from candor.backends.base import Completion
from candor.serve.answering import Ask, HonestAnswer


class RecordLog:
    """Writes served records to the store (and its JSONL export); finds and labels them for feedback."""

    def __init__(self, store: ServedStore) -> None:
        self.store = store

    def write(
        self,
        ask: Ask,
        answers: Sequence[HonestAnswer],
        provenance: dict[str, Any],
        describe: Callable[[HonestAnswer], dict[str, Any]],
        response_id: str = "",
        indexes: Sequence[int] = (0,),
    ) -> None:
        record = next((a.record for a in answers if a.record is not None), None)
        if record is None:  # a head source: nothing was scored, the returned text stands as the answer
            greedy = next((a.completion for a in answers if a.completion is not None), None) or Completion("")
            record = Record(item=ask.prompted.item(), greedy=greedy, samples=[], provenance=dict(provenance))
        out = record.to_dict()
        out["provenance"] = {
            **out["provenance"],
            "served": {
                "id": response_id,
                "indexes": list(indexes),
                "confidence": [describe(a) for a in answers],
                "returned": [a.answer for a in answers],
                # --claims: each claim's text, removed ones included; the operator's alone (a client gets spans)
                "claims": [None if a.claims is None else a.claims.for_record() for a in answers],
                "reply": {
                    "n": ask.reply.n,
                    "max_tokens": ask.reply.max_new_tokens,
                    "temperature": ask.reply.temperature,
                    "top_p": ask.reply.top_p,
                    "stop": list(ask.reply.stop),
                    "seed": ask.reply.seed,
                },
            },
        }
        choices = [
            ServedChoice(index=i, answered=not a.abstained, returned=a.answer, scored=a.scores_returned_text)
            for i, a in zip(indexes, answers, strict=True)
        ]
        self.store.record(out, response_id, choices, str(provenance.get("model_version", "")))

    def find(self, response_id: str, index: int) -> RememberedChoice | None:
        """The served choice a label names, while the store remembers it (any replica may have served it)."""
        return self.store.find(response_id, index)

    def label(self, response_id: str, index: int, correct: bool, label_source: str, who: str = "") -> None:
        self.store.add_label(response_id, index, correct, label_source, who)

    def close(self) -> None:
        self.store.close()
