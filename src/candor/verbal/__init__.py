"""Verbalized confidence: the model states how sure it is, and P(C | q, a) is read from its log-probs.

- :mod:`candor.verbal.formats`: the five ADVICE formats (labels, values,
  parsing of generated replies) and their prompts; P(C | q, a) and μ on any backend.
- :mod:`candor.verbal.distribution`: P(label | prompt) over a closed label set
  at inference (numpy, from the backend's candidate scores).
- :mod:`candor.verbal.scorer`: the same distribution as a differentiable torch
  expression of the model, for training (ADVICE, ConfTuner) and diagnostics.

Inference and training must give the same numbers; ``tests/test_verbal_scorer.py``
checks that on every format.

May import: :mod:`candor.util`, :mod:`candor.data`, :mod:`candor.backends`, :mod:`candor.annotation`.
"""
