"""The tables behind every figure and the HTML page, computed once from the stored trials.

Figures and the notebook draw from these functions, so a number on a plot, in the HTML
table and in a notebook cell is the same number, and each one traces back to a trial
``number`` in the store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from parsearch.config import LAYOUT_DIMENSIONS, ParallelLayout
from parsearch.failures import FAILURE_STATES, FailureGroup, group_failures
from parsearch.result import FINISHED_STATES, TrialState
from parsearch.scaling import ScalingStudy, chosen_campaign, read_studies
from parsearch.space import SearchSpace, space_from_dict
from parsearch.store import Campaign, open_store

# How a metric is named on an axis, and how its values are printed.
METRIC_LABELS = {
    "tokens_per_s": "tokens/s",
    "tflops_per_device": "TFLOP/s per device",
    "mfu": "MFU",
    "step_time_s": "step time (s)",
}
FAILED_STATES = ("timeout", "error")  # failures that are not out-of-memory


@dataclass(frozen=True)
class ReportData:
    """One campaign as the report sees it: its space, its objective and a frame of trials.

    ``trials`` is :meth:`SQLiteStore.dataframe`: one row per trial, layout fields, ``state``,
    ``objective`` (ok trials only), measured metrics by name and ``predicted.<metric>``.
    ``failures``: the failed trials grouped by state and reason (as ``parsearch status``).
    """

    campaign: Campaign
    space: SearchSpace
    trials: pd.DataFrame
    failures: tuple[FailureGroup, ...] = ()
    studies: list[ScalingStudy] = field(default_factory=list)  # `parsearch scaling` runs

    @property
    def objective(self) -> str:
        return self.campaign.objective_metric

    @property
    def objective_label(self) -> str:
        return METRIC_LABELS.get(self.objective, self.objective)

    @property
    def memory_limit_bytes(self) -> int:
        return self.space.memory_limit_bytes

    def column(self, name: str) -> pd.Series:
        """A column as floats; all-NaN when no trial has reported it yet."""
        if name in self.trials:
            return pd.to_numeric(self.trials[name], errors="coerce")
        return pd.Series(math.nan, index=self.trials.index, dtype="float64")

    def ok(self) -> pd.DataFrame:
        """Ok trials with an objective, as the store ranks them (``top``'s order)."""
        frame = self.trials.assign(
            objective=self.column("objective"), peak_mem_bytes=self.column("peak_mem_bytes")
        )
        frame = frame[(frame["state"] == TrialState.OK.value) & frame["objective"].notna()]
        return frame.sort_values(
            ["objective", "peak_mem_bytes", "trial_id"], ascending=[False, True, True]
        )

    def answer(self) -> pd.Series | None:
        """The campaign's answer as ``parsearch best`` gives it: the best trial measured at
        full scale, or a proxy's prediction while none succeeded (``fidelity`` says which)."""
        ok = self.ok()
        full = ok[ok["fidelity"] != "proxy"]
        chosen = full if not full.empty else ok
        return None if chosen.empty else chosen.iloc[0]

    def best_layout(self) -> ParallelLayout | None:
        row = self.answer()
        return None if row is None else layout_of(row)


def load_report_data(store_path: str | Path, name: str | None = None) -> ReportData:
    """Read a campaign (the latest one without ``name``) from a store, read-only.

    Read-only so that a report can be drawn from a login node while the driver writes.
    """
    with open_store(store_path, readonly=True) as store:
        campaign = chosen_campaign(store, name)
        trials = store.dataframe(campaign.id)
        failures = tuple(group_failures(store.trials(campaign.id, FAILURE_STATES)))
        studies = read_studies(store, campaign.name)
    space = space_from_dict(campaign.space, source=campaign.space_path or campaign.name)
    return ReportData(
        campaign=campaign, space=space, trials=trials, failures=failures, studies=studies
    )


def layout_of(row: pd.Series) -> ParallelLayout:
    return ParallelLayout.from_dict({d.name: row[d.name] for d in LAYOUT_DIMENSIONS})


def convergence(data: ReportData) -> pd.DataFrame:
    """Finished trials in the order they finished, with the best objective so far.

    Columns: ``finished`` (1, 2, ... : the x axis), ``number`` (the trial), ``state``,
    ``value`` (objective of an ok trial, NaN otherwise) and ``best_so_far``.
    Finish order, not trial number: with many slots trials finish out of order, and the
    question is how good the answer was after N results.
    """
    states = {state.value for state in FINISHED_STATES}
    frame = data.trials[data.trials["state"].isin(states)].copy()
    frame["value"] = data.column("objective")
    frame.loc[frame["state"] != TrialState.OK.value, "value"] = math.nan
    frame = frame.sort_values(["finished_at", "number"], kind="stable")
    frame["finished"] = range(1, len(frame) + 1)
    # cummax leaves NaN where a trial failed; the best so far carries over failures.
    frame["best_so_far"] = frame["value"].cummax().ffill()
    return frame[["finished", "number", "state", "value", "best_so_far"]].reset_index(drop=True)


def tp_pp_grid(data: ReportData) -> pd.DataFrame:
    """One row per (pp, tp) of the space: what happened to that cell.

    ``kind`` is ``ok`` (some trial ran; ``best`` is its best objective, ``best_number`` that
    trial), ``oom`` (no ok trial, at least one out of memory), ``failed`` (no ok trial,
    timeouts/errors only), ``no_divide`` (no layout of the cell satisfies the divisibility
    rules), ``predicted_oom`` (nothing ran; every dividing layout is predicted to run out of
    memory, so the search prunes them) or ``not_run``. ``trials`` counts the cell's recorded
    trials; ``oom``, ``failed`` and ``infeasible`` (recorded as breaking the rules, not run)
    its trials without a value.
    """
    plan = data.space.plan()
    dividing = {(layout.tp, layout.pp) for layout, _ in plan.feasible}
    predicted_oom_only = {(layout.tp, layout.pp) for layout, _ in plan.predicted_oom} - dividing
    dividing |= predicted_oom_only
    trials = data.trials.assign(objective=data.column("objective"))
    rows = []
    for pp in data.space.dimensions["pp"]:
        for tp in data.space.dimensions["tp"]:
            cell = trials[(trials["tp"] == tp) & (trials["pp"] == pp)]
            states = cell["state"]
            ok = cell[states == TrialState.OK.value].dropna(subset=["objective"])
            n_oom = int((states == TrialState.OOM.value).sum())
            n_failed = int(states.isin(FAILED_STATES).sum())
            n_infeasible = int((states == TrialState.INFEASIBLE.value).sum())
            best = ok.loc[ok["objective"].idxmax()] if not ok.empty else None
            if best is not None:
                kind = "ok"
            elif n_oom:
                kind = "oom"
            elif n_failed:
                kind = "failed"
            elif (tp, pp) not in dividing:
                kind = "no_divide"
            elif (tp, pp) in predicted_oom_only:
                kind = "predicted_oom"
            else:
                kind = "not_run"
            rows.append(
                {
                    "tp": tp,
                    "pp": pp,
                    "kind": kind,
                    "best": math.nan if best is None else float(best["objective"]),
                    "best_number": None if best is None else int(best["number"]),
                    "trials": len(cell),
                    "oom": n_oom,
                    "failed": n_failed,
                    "infeasible": n_infeasible,
                }
            )
    grid = pd.DataFrame(rows)
    grid["best_number"] = grid["best_number"].astype("Int64")  # trial numbers, NA if none
    return grid


def pareto_front(data: ReportData) -> pd.DataFrame:
    """Ok trials no other ok trial beats on both objective (higher) and peak memory (lower).

    Same rule as :meth:`SQLiteStore.pareto`: trials without a measured peak memory are left
    out, and trials with identical figures are all kept. Ordered by memory.
    """
    ok = data.ok().dropna(subset=["peak_mem_bytes"])
    ok = ok.sort_values(["peak_mem_bytes", "objective"], ascending=[True, False])
    keep = []
    best_below = -math.inf
    for _, group in ok.groupby("peak_mem_bytes", sort=True):
        top = group["objective"].max()
        if top > best_below:
            keep.extend(group.index[group["objective"] == top])
        best_below = max(best_below, top)
    return ok.loc[keep]


@dataclass(frozen=True)
class Accuracy:
    """How the analytic estimate compares with what the trials measured, for one metric.

    ``ratio`` is measured / predicted per trial. ``spearman`` is the rank correlation: what
    matters when the estimate is used to order and seed layouts.
    """

    metric: str
    pairs: pd.DataFrame  # columns: number, predicted, measured, ratio
    n: int
    median_ratio: float
    q25_ratio: float
    q75_ratio: float
    mean_abs_pct_error: float
    spearman: float

    def caption(self) -> str:
        if not self.n:
            return "no ok trial with both a prediction and a measurement"
        text = (
            f"measured/predicted: median {self.median_ratio:.2f} "
            f"(IQR {self.q25_ratio:.2f}–{self.q75_ratio:.2f})\n"
            f"mean |error| {self.mean_abs_pct_error:.0%}"
        )
        if not math.isnan(self.spearman):
            text += f", rank correlation {self.spearman:.2f}"
        return f"{text}, n = {self.n}"


def accuracy(data: ReportData, metric: str) -> Accuracy:
    """Measured vs predicted ``metric`` over the ok trials that have both."""
    pairs = pd.DataFrame(
        {
            "number": data.trials["number"],
            "predicted": data.column(f"predicted.{metric}"),
            "measured": data.column(metric),
        }
    )
    ok = data.trials["state"] == TrialState.OK.value
    pairs = pairs[ok & (pairs["predicted"] > 0) & (pairs["measured"] > 0)].copy()
    pairs["ratio"] = pairs["measured"] / pairs["predicted"]
    n = len(pairs)
    ratio = pairs["ratio"]
    spearman = pairs["predicted"].corr(pairs["measured"], method="spearman") if n > 2 else math.nan
    return Accuracy(
        metric=metric,
        pairs=pairs.reset_index(drop=True),
        n=n,
        median_ratio=float(ratio.median()) if n else math.nan,
        q25_ratio=float(ratio.quantile(0.25)) if n else math.nan,
        q75_ratio=float(ratio.quantile(0.75)) if n else math.nan,
        mean_abs_pct_error=float((ratio - 1).abs().mean()) if n else math.nan,
        spearman=float(spearman),
    )


def top_table(data: ReportData, k: int = 10) -> pd.DataFrame:
    """The ``k`` best ok trials (store order) with the columns a person compares."""
    ok = data.ok().head(k)
    table = pd.DataFrame(
        {
            "rank": range(1, len(ok) + 1),
            "trial": ok["number"].astype(int).to_numpy(),
            "layout": [layout_of(row).short() for _, row in ok.iterrows()],
            data.objective: ok["objective"].to_numpy(),
            # proxy: the figures are predicted at full scale from a run at fewer replicas
            "fidelity": [
                "full" if row["fidelity"] != "proxy" else f"proxy dp{int(row['proxy_dp'])}"
                for _, row in ok.iterrows()
            ],
        }
    )
    for metric in ("step_time_s", "tflops_per_device", "mfu", "peak_mem_bytes"):
        if metric != data.objective:
            table[metric] = data.column(metric).loc[ok.index].to_numpy()
    predicted = data.column(f"predicted.{data.objective}").loc[ok.index].to_numpy()
    table[f"predicted {data.objective}"] = predicted
    return table
