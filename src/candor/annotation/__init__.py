"""Annotation: a model answers QA items, and judges say which answers are right.

See docs/methods.md "Generation and judging".

- :mod:`~candor.annotation.builder`: the HonestyBench builder (batching, resume, shards, merge).
- :mod:`~candor.annotation.workers`: ``annotate --workers``: shards in parallel processes on one CPU, merged.
- :mod:`~candor.annotation.prompts`: the QA prompt templates, and the prompt each record was answered with.
- :mod:`~candor.annotation.judges`: correctness and consistency judges, in registries.
- :mod:`~candor.annotation.text_matching`: normalization, containment, ROUGE-L and option letters
  the lexical judges share.
- :mod:`~candor.annotation.rejudge`: new verdicts on existing records, without generating again.
- :mod:`~candor.annotation.records`: the records file, and HonestyBench import and export.
- :mod:`~candor.annotation.contamination`: the guard on which questions a file holds or a
  trained folder has seen (trainers refuse test questions; scoring warns about seen ones).

May import: :mod:`candor.util`, :mod:`candor.data`, :mod:`candor.backends`.
"""
