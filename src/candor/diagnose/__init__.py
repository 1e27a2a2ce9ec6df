"""Diagnostics: is a model's confidence grounded in its answer?

See docs/methods.md "Verbalized answer-level confidence", "ADVICE and ConfTuner".

One call runs every stage and writes the report::

    from candor.diagnose import DiagnoseConfig, run_diagnosis

    report = run_diagnosis(records, "out/diagnose", adapter="adapters/advice", adapter_name="advice")
    report.summary()["base"]["share_jsd_le_0.1"]

The stages, one module each:

- ``sensitivity``: P(C | q, a_i) over up to 30 candidate answers per question
  (``candidates``) and the pairwise Jensen-Shannon divergences;
- ``masking``: the same distribution with the answer replaced by pad tokens;
- ``rollout``: attention rollout from the confidence position to the BOS,
  template, question and answer tokens (``regions``);
- ``attribution``: integrated gradients (captum) of μ on the input embeddings.

``diagnosis_report`` writes Markdown, JSON and plots with the models side by side (and
``diagnosis_page`` the HTML page); ``config_and_results`` holds the settings and each model's
results; ``runner`` runs the stages, with a cache.

May import every stage before it (util, data, backends, annotation, verbal, estimators,
evaluation, train); nothing imports it but :mod:`candor.serve` and the front door.
"""

from candor.diagnose.candidates import CandidateSet, build_candidates
from candor.diagnose.config_and_results import STAGE_NAMES, DiagnoseConfig, ModelDiagnosis
from candor.diagnose.diagnosis_report import write_diagnosis_report
from candor.diagnose.runner import STAGES, DiagnosisReport, diagnose_model, run_diagnosis

__all__ = [
    "STAGES",
    "STAGE_NAMES",
    "CandidateSet",
    "DiagnoseConfig",
    "DiagnosisReport",
    "ModelDiagnosis",
    "build_candidates",
    "diagnose_model",
    "run_diagnosis",
    "write_diagnosis_report",
]
