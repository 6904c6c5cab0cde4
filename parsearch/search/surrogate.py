"""DeepHyper's surrogate in the estimate's frame (scikit-learn is imported with it).

Imported by :mod:`parsearch.search.optimizer` when it builds DeepHyper's search, not before:
``import parsearch`` stays free of scikit-learn.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin

from parsearch.search.residual import EstimateFrame


class EstimateSurrogate(RegressorMixin, BaseEstimator):
    """DeepHyper's surrogate in the estimate's frame (scikit-learn's regressor interface).

    DeepHyper minimises, so it is told ``-log(objective)``: :meth:`fit` learns the
    :class:`~parsearch.search.residual.ResidualField` of those measurements against the
    calibrated estimate, and
    :meth:`predict` returns ``-(log calibrated + residual mean)`` with the field's spread
    (DeepHyper's ``UCBd`` acquisition asks for the epistemic part apart: the field's, the
    trials' noise being the aleatoric). The calibration is read when predicting, so an
    acquisition always ranks by the estimate as calibrated now. A point that is no item
    (DeepHyper draws only items here) predicts the worst told value.
    """

    def __init__(self, frame: EstimateFrame | None = None):
        self.frame = frame

    def fit(self, X: Any, y: Any) -> EstimateSurrogate:
        assert self.frame is not None
        items = self.frame.items_of(np.asarray(X))
        self.field_ = self.frame.field()
        told = np.asarray(y, dtype=float)
        for item, value in zip(items, told, strict=True):
            if item >= 0:
                self.field_.add(int(item), math.exp(-value))
        self.worst_ = float(told.max()) if len(told) else 0.0
        return self

    def predict(self, X: Any, return_std: bool = False, disentangled_std: bool = False) -> Any:
        assert self.frame is not None
        items = self.frame.items_of(np.asarray(X))
        known = items >= 0
        calibrated = self.frame.calibrated()
        mean = np.full(len(items), self.worst_)
        spread = np.full(len(items), self.field_.amplitude)
        if known.any():
            residual, error = self.field_.posterior(calibrated, at=items[known])
            mean[known] = -(np.log(calibrated[items[known]]) + residual)
            spread[known] = error
        if disentangled_std:
            return mean, np.full(len(items), self.field_.noise), spread
        return (mean, spread) if return_std else mean
