"""Which searched dimensions matter to the objective: permutation importance of a random
forest (scikit-learn), for the dashboard's importance panel.

A random forest is fitted to the campaign's ok trials (each searched dimension a feature,
categorical values by their index in the space; the objective the target); a dimension's
importance is how much the forest's R² drops when that dimension's values are shuffled
among the trials (``sklearn.inspection.permutation_importance``, 5 repeats of 40 trees). It says
how much the measured objective depends on a dimension *among the trials run*: a campaign
that never varied a dimension cannot rank it, and a forest that fits poorly (low R²) ranks
nothing reliably, so both figures are served with it. scikit-learn comes with DeepHyper;
without it the panel says so.
"""

from __future__ import annotations

import math
from typing import Any

from parsearch.report.data import ReportData
from parsearch.result import TrialState

MIN_TRIALS = 10  # fewer ok trials than this: no ranking worth drawing
METHOD = (
    "permutation importance (scikit-learn) of a random forest fitted to the ok trials: "
    "the drop in R² when a dimension's values are shuffled"
)


def importance(data: ReportData) -> dict[str, Any]:
    """The searched dimensions ranked by permutation importance for the objective."""
    names = list(data.space.searched)
    answer: dict[str, Any] = {
        "method": METHOD,
        "objective": data.objective,
        "n": 0,
        "r2": None,
        "dimensions": [],
        "note": None,
    }
    frame = data.trials
    ok = frame[(frame["state"] == TrialState.OK.value) & data.column("objective").notna()]
    answer["n"] = len(ok)
    if not names:
        answer["note"] = "the space searches no dimension"
        return answer
    if len(ok) < MIN_TRIALS:
        answer["note"] = f"needs {MIN_TRIALS} successful trials; {len(ok)} so far"
        return answer
    try:
        from sklearn.ensemble import RandomForestRegressor
        from sklearn.inspection import permutation_importance
    except ImportError as error:
        answer["note"] = f"scikit-learn is not installed here ({error})"
        return answer
    features = [
        [_code(data.space.searched[name], row[name]) for name in names] for _, row in ok.iterrows()
    ]
    target = [float(value) for value in ok["objective"]]
    forest = RandomForestRegressor(
        n_estimators=40, min_samples_leaf=2, random_state=0, n_jobs=1
    ).fit(features, target)
    found = permutation_importance(forest, features, target, n_repeats=5, random_state=0)
    answer["r2"] = _finite(forest.score(features, target))
    answer["dimensions"] = sorted(
        (
            {
                "name": name,
                "importance": _finite(found.importances_mean[i]),
                "std": _finite(found.importances_std[i]),
                "values_tried": int(ok[name].nunique()),
            }
            for i, name in enumerate(names)
        ),
        key=lambda item: -(item["importance"] or 0.0),
    )
    return answer


def _code(values: tuple[Any, ...], value: Any) -> float:
    """A dimension's value as a number: itself if numeric, else its index in the space."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return float(values.index(value)) if value in values else -1.0
    return float(value)


def _finite(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
