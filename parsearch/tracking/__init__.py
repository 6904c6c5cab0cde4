"""Experiment trackers: every finished trial also logged where a team already looks (MLflow).

``--track mlflow[:URI]`` on ``run``/``resume`` adds a tracker as a driver observer
(:mod:`parsearch.campaign.observers`); ``parsearch export --to mlflow[:URI]`` logs a
campaign's finished trials after the fact. Tracker packages are optional extras, imported
only when a tracker is asked for.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from parsearch.errors import TrackingError

if TYPE_CHECKING:
    from parsearch.campaign.observers import Observers
    from parsearch.tracking.mlflow_tracker import MlflowTracker

TRACKERS = ("mlflow",)


@dataclass(frozen=True)
class TrackTarget:
    """``mlflow`` or ``mlflow:URI``: which tracker, and where it writes."""

    kind: str
    uri: str | None = None


def parse_target(text: str) -> TrackTarget:
    """``mlflow``, ``mlflow:file:///path/mlruns``, ``mlflow:http://host:5000``..."""
    kind, _, uri = text.partition(":")
    if kind not in TRACKERS:
        raise TrackingError(
            f"unknown tracker {kind!r} in {text!r}; valid: "
            + ", ".join(f"{name} or {name}:URI" for name in TRACKERS)
        )
    return TrackTarget(kind, uri or None)


def track_target(text: str) -> TrackTarget:
    """:func:`parse_target` as an argparse type."""
    try:
        return parse_target(text)
    except TrackingError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_track_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--track",
        type=track_target,
        action="append",
        default=[],
        metavar="mlflow[:URI]",
        help="also log every finished trial to MLflow (a run per trial, the campaign as the "
        "experiment), from a background thread: a tracking server that is slow or down "
        "never delays the campaign (what it misses, `export --to` logs later); URI defaults "
        "to $MLFLOW_TRACKING_URI, else ./mlruns. Repeatable",
    )


def make_tracker(
    target: TrackTarget, store_path: str | os.PathLike[str] | None = None
) -> MlflowTracker:
    """The tracker for ``target``; imports its package now, so that a missing one fails
    before the campaign starts. ``store_path`` is tagged on every run it logs."""
    from parsearch.tracking.mlflow_tracker import MlflowTracker

    return MlflowTracker(target.uri, store_path=store_path)


def make_observers(
    targets: list[TrackTarget], store_path: str | os.PathLike[str] | None = None
) -> Observers:
    """The driver observers for ``--track`` targets, each on a worker thread of its own
    (:class:`~parsearch.tracking.background.BackgroundTracker`): a tracking server that is
    slow or down never delays a trial nor the campaign's end by more than a few seconds."""
    from parsearch.campaign.observers import Observers
    from parsearch.tracking.background import BackgroundTracker

    return Observers([BackgroundTracker(make_tracker(target, store_path)) for target in targets])
