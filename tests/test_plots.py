from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np
import pytest

from candor.evaluation.plots import loss_curves
from candor.util.errors import CandorError

HISTORY = [
    {"loss": 3.0, "loss_lm": 2.0, "loss_jsd": 0.6, "epoch": 0.5, "step": 1},
    {"eval_loss": 2.5, "epoch": 0.5, "step": 1},  # an evaluation row: no training loss terms
    {"loss": 2.0, "loss_lm": 1.4, "loss_jsd": 0.5, "epoch": 1.0, "step": 2},
    {"loss": 1.5, "loss_lm": 1.0, "loss_jsd": 0.4, "epoch": 1.5, "step": 3},
]


def test_loss_curves_draws_one_line_per_logged_term(tmp_path):
    path = loss_curves(HISTORY, tmp_path / "curves" / "advice.png", title="ADVICE")
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300
    assert np.unique(image.reshape(-1, image.shape[-1]), axis=0).shape[0] > 10  # not a blank canvas
    assert not list(tmp_path.glob("curves/*.tmp*"))


def test_loss_curves_without_a_logged_loss_is_a_clear_error(tmp_path):
    with pytest.raises(CandorError, match="no loss was logged"):
        loss_curves([{"eval_loss": 1.0, "step": 1}], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
