"""Evaluation: how good a confidence is, with the numbers, tables and plots people read (docs/methods.md "Metrics").

- :mod:`~candor.evaluation.metrics`: ECE, Brier, AUROC, NCE, Alignment and the selective metrics, with metadata.
- :mod:`~candor.evaluation.aggregate`: metrics aggregated per dataset and group, over seeds, with bootstrap intervals.
- :mod:`~candor.evaluation.calibration`: post-hoc calibrators, and calibrating a confidences file.
- :mod:`~candor.evaluation.summary`: an evaluation's numbers (:func:`evaluate_table`) and its summary tables.
- :mod:`~candor.evaluation.report`: the report a confidences file turns into (files, plots, index);
  :mod:`~candor.evaluation.report_page`: its ``report.html``.
- :mod:`~candor.evaluation.plots`: reliability diagrams, histograms, risk-coverage curves.
- :mod:`~candor.evaluation.confidence_sequence`: anytime-valid bounds on a mean, by betting (the drift alarm).

May import: :mod:`candor.util`, :mod:`candor.data`, :mod:`candor.backends`,
:mod:`candor.annotation`, :mod:`candor.verbal`, :mod:`candor.estimators`.
"""
