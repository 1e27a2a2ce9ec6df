"""Small shared utilities every stage uses; they import nothing else of candor.

- :mod:`~candor.util.errors`: :class:`CandorError`, the one exception for user mistakes.
- :mod:`~candor.util.files`: atomic writes and keyed caches.
- :mod:`~candor.util.jsonl`: reading JSON lines with file and line in every error.
- :mod:`~candor.util.digests`: content digests that cache keys are made of.
- :mod:`~candor.util.seeds`: seeding every random source.
- :mod:`~candor.util.resource_meter`: what a run cost (time, CPU, memory).
- :mod:`~candor.util.registry`: :class:`Registry`, one per kind of named thing.
- :mod:`~candor.util.lazy`: package names imported on first use.
- :mod:`~candor.util.version`: candor's version.
"""
