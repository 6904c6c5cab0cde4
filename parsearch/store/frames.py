"""A campaign's trials as a pandas DataFrame, and its export to CSV or Parquet.

pandas is imported here and this module is imported only when a frame is asked for, so that
opening a store (and ``import parsearch``) stays light.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from parsearch.config import LAYOUT_DIMENSIONS
from parsearch.errors import StoreError
from parsearch.store.records import decode_json_column

EXPORT_SUFFIXES = (".csv", ".parquet")
TIME_COLUMNS = ("created_at", "started_at", "finished_at")
LAYOUT_FIELDS = tuple(d.name for d in LAYOUT_DIMENSIONS)
BASE_COLUMNS = (
    "trial_id",
    "number",
    "key",
    "state",
    "origin",
    "attempt",
    *LAYOUT_FIELDS,
    "objective",
    "fidelity",
    "proxy_dp",
    *TIME_COLUMNS,
    "duration_s",
    "hosts",
    "error",
)


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts become dotted names; lists become JSON text.

    Scalar columns are what CSV and Parquet both store and read back unchanged; a per-rank
    list kept as text survives both and is one ``json.loads`` away.
    """
    flat: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{name}."))
        elif isinstance(value, list):
            flat[f"{prefix}{name}"] = json.dumps(value)
        else:
            flat[f"{prefix}{name}"] = value
    return flat


# What a frame reads: everything but the log tails, which at kilobytes a trial would dwarf
# the rest of an export (they stay in the store, in TrialRecord.log_tail).
FRAME_COLUMNS = (
    "id, number, key, state, origin, attempt, config, objective, created_at, started_at, "
    "finished_at, duration_s, hosts, error, metrics, predicted, proxy_dp"
)


def trials_frame(rows: Sequence[Sequence[Any]]) -> pd.DataFrame:
    """One row per trial from rows selected as :data:`FRAME_COLUMNS`, in their order.

    Columns: the trial's identity and state, the layout fields (``tp``, ``pp``, ...), the
    objective, ``fidelity`` (``full``: measured at full scale; ``proxy``: the objective and
    metrics are predicted from a run at ``proxy_dp`` replicas, whose own figures are the
    ``fidelity.measured.*`` columns), times (UTC datetimes), ``hosts`` (comma-separated),
    ``error``, then each metric under its own name (``metric.<name>`` if that name is
    taken above) and each prediction as ``predicted.<name>``. Built column by column: a
    dict per row costs twice as long.
    """
    if not rows:
        frame = pd.DataFrame(columns=list(BASE_COLUMNS))
        for column in TIME_COLUMNS:
            frame[column] = pd.to_datetime(frame[column], utc=True)
        return frame
    (
        ids,
        numbers,
        keys,
        states,
        origins,
        attempts,
        configs,
        objectives,
        created,
        started,
        finished,
        durations,
        hosts,
        errors,
        metrics,
        predicted,
        proxy_dps,
    ) = zip(*rows, strict=True)
    columns: dict[str, Any] = {
        "trial_id": ids,
        "number": numbers,
        "key": keys,
        "state": states,
        "origin": origins,
        "attempt": attempts,
    }
    decoded_configs = decode_json_column(configs)
    # A dimension added after a trial was stored reads as its default, as the layout does.
    for dimension in LAYOUT_DIMENSIONS:
        columns[dimension.name] = [
            config.get(dimension.name, dimension.default) for config in decoded_configs
        ]
    columns["objective"] = pd.Series(objectives, dtype="float64")
    columns["fidelity"] = ["full" if dp is None else "proxy" for dp in proxy_dps]
    columns["proxy_dp"] = pd.Series(proxy_dps, dtype="Int64")
    for name, values in zip(TIME_COLUMNS, (created, started, finished), strict=True):
        columns[name] = pd.to_datetime(pd.Series(values, dtype="float64"), unit="s", utc=True)
    columns["duration_s"] = pd.Series(durations, dtype="float64")
    # Missing text is NaN, not "" or None, as CSV and Parquet readers give it back.
    joined_hosts = [",".join(names) or None for names in decode_json_column(hosts)]
    columns["hosts"] = pd.Series(joined_hosts, dtype="str")
    columns["error"] = pd.Series(errors, dtype="str")
    frame = pd.DataFrame(columns)
    measured = pd.DataFrame.from_records([_flatten(m) for m in decode_json_column(metrics)])
    measured = measured.rename(columns={c: f"metric.{c}" for c in measured if c in columns})
    expected = pd.DataFrame.from_records(
        [_flatten(p or {}) for p in decode_json_column(predicted)]
    ).add_prefix("predicted.")
    return pd.concat([frame, measured, expected], axis=1)


def check_export_path(path: Path) -> Path:
    """Refuse an unknown format before any work is done."""
    suffix = path.suffix.lower()
    if suffix not in EXPORT_SUFFIXES:
        raise StoreError(
            f"cannot export to {path}: the file name must end in one of {list(EXPORT_SUFFIXES)}"
        )
    if suffix == ".parquet" and importlib.util.find_spec("pyarrow") is None:
        raise StoreError(
            f"exporting {path} as Parquet needs pyarrow: pip install 'parsearch[parquet]'"
        )
    return path


def write_frame(frame: pd.DataFrame, path: Path) -> Path:
    try:
        if path.suffix.lower() == ".csv":
            frame.to_csv(path, index=False)
        else:
            frame.to_parquet(path, index=False, engine="pyarrow")
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except (TypeError, ValueError) as exc:  # pyarrow's type errors derive from these
        raise StoreError(f"cannot write {path}: a column mixes types ({exc})") from exc
    return path
