"""``--log-records FILE``: every served question as one JSONL line in candor's records format.

Each line is a :class:`~candor.annotation.records.Record` (``read_records``
reads the file back): the question, the greedy answer the confidence was
computed for, the method's samples, and in ``provenance`` the model, template
and decoding they were made with plus ``served``: the confidence object each
choice got, the texts returned and, with ``--claims``, each claim's text
(a removed claim's too, which no client is sent). Such a file can be re-scored, judged
against gold answers later (``candor rejudge``) and used as a calibration set.
``served.id`` is the response id a client saw and ``served.indexes`` the choices
the record's answers fill in it, so a label sent later (``POST /v1/feedback``)
finds its record.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.serve.answering import Ask, HonestAnswer
from candor.serve.http.feedback import ServedIndex


class RecordLog:
    """Appends served records to a JSONL file, one whole line per question (safe across threads)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.served = ServedIndex()  # the recent responses, so feedback can name what was served
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

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
        line = json.dumps(out, ensure_ascii=False) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
        answered = [not a.abstained for a in answers]
        self.served.remember(response_id, indexes, answered, str(provenance.get("model_version", "")))

    def close(self) -> None:
        with self._lock:
            self._file.close()
