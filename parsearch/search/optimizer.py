"""DeepHyper's CBO in ask/tell form, set up to stay cheap at hundreds of trials and slots.

Settings, each measured with ``benchmarks/driver_overhead.py``:

* ``acq_optimizer="sampling"``: the acquisition is maximised over sampled points. DeepHyper's
  default ("mixedga") costs ~1 s per tell by 100 results; sampling stays near 0.01 s.
* When a sampler is given (the enumerated candidates), it *is* the constraint: every point
  DeepHyper draws, for its random initial phase and for the acquisition, comes from it. We
  pass it as ``problem.set_sampling_fn`` and not as ``set_constraint_fn``: DeepHyper runs a
  constraint over a pandas DataFrame of 10 000 rejection samples and converts them to dicts
  twice, which took 0.17 s per ask *and* per tell; drawing from the candidate list is exact
  and took 0.01 s. With no more candidates than ``n_points``, each draw is a permutation of
  all of them, so the acquisition is evaluated on every unseen candidate.
* ``multi_point_strategy="topk"``: when several slots free at once, the best points of the
  acquisition computed at the last tell, in order (no refit: 512 points in ~0.1 s).
  ``qUCB`` draws a random kappa per point but, on these discrete spaces, most draws pick the
  same argmax: with 16 slots most of its batch were repeats, which the strategy replaces by
  the estimate's next best, which sit at the memory wall. Measured with 16 slots, 64 trials,
  8 seeds, memory 15% above the estimate: topk failed 17-42% of trials where qUCB failed
  29-41% (175B: 19% vs 41%), and reached 97% of the optimum in as few or fewer trials on
  the 1T, 175B and 70B spaces (on 22B neither did in most seeds). ``cl_max`` (DeepHyper's
  default) refits per point: 3.7 s to ask 64.
* ``max_total_failures=-1``: DeepHyper stops a search after 100 failures by default; an
  out-of-memory trial is information here, not a reason to stop.
* ``checkpoint_history_to_csv=False`` and a private temporary ``log_dir``: the store is the
  record; nothing is written to the working directory.
* ``frame``: a strategy that has a better prior than a flat one hands DeepHyper its
  estimate (:class:`~parsearch.search.residual.EstimateFrame`), and DeepHyper's surrogate
  is :class:`~parsearch.search.surrogate.EstimateSurrogate`: the calibrated estimate plus
  a Gaussian process on what it gets wrong. DeepHyper then learns that
  residual from every result it is told, and its acquisition scores its proposals in the
  estimate's frame. Told objectives are then not rescaled (``objective_scaler``
  ``identity``: the surrogate needs them as told), nor clipped as outliers, and failures
  are left out of the fit (``filter_failures="ignore"``: an out-of-memory layout says
  nothing about throughput; the strategy prunes by memory itself).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from parsearch.search.residual import EstimateFrame
from parsearch.tempdirs import owned_tempdir

Objective = float | str
Point = dict[str, Any]


@dataclass(frozen=True)
class CBOSettings:
    """The DeepHyper knobs a strategy may tune."""

    surrogate_model: str = "ET"
    acq_optimizer: str = "sampling"
    multi_point_strategy: str = "topk"
    kappa: float = 1.96
    n_points: int = 10_000
    # DeepHyper's schedule of kappa ("constant", "bandit", "periodic-exp-decay"); ``None``:
    # DeepHyper's default (periodic-exp-decay: 1.96 down to 0.01 over 10 asks, repeated).
    kappa_schedule: str | None = None


class BayesianOptimizer:
    """CBO over named discrete dimensions, optionally restricted to a list of points.

    ``dimensions`` maps each name to its candidate values. Integer dimensions are given to
    DeepHyper as they are; any other (``recompute``'s strings, ``sequence_parallel``'s
    booleans) as the index of each value, in the space's order. DeepHyper's ``topk``
    returns points in its internal encoding, which for strings is a label index, not the
    string; with every dimension an integer that encoding is the identity. ``allowed``, when
    given, lists the only points that may ever be proposed.
    """

    def __init__(
        self,
        dimensions: Mapping[str, Sequence[Any]],
        *,
        seed: int,
        settings: CBOSettings | None = None,
        allowed: Sequence[Point] | None = None,
        n_initial_points: int | None = None,
        frame: EstimateFrame | None = None,
    ):
        self._settings = settings or CBOSettings()
        self.names = tuple(dimensions)
        self._dimensions = {name: list(values) for name, values in dimensions.items()}
        self._codes = {
            name: {value: index for index, value in enumerate(values)}
            for name, values in dimensions.items()
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in values)
        }
        self._values = {name: list(codes) for name, codes in self._codes.items()}
        self._sampler: _PermutationSampler | None = None
        if allowed is not None:
            self._sampler = _PermutationSampler(self._table(allowed), seed)
        self._seed = seed
        self._n_initial_points = n_initial_points
        self._told: list[tuple[Point, Objective]] = []
        self._log_dir: Path | None = None
        self._search: Any = None
        self._frame = frame

    def _cbo(self) -> Any:
        """DeepHyper's search, built at the first :meth:`ask`: importing DeepHyper takes
        seconds (it brings Ray, pandas, matplotlib and SciPy), which a campaign whose
        trials all come from the estimate (short ones, the scaling study's, most tests')
        never pays. Results are told at an ask in any case, so the search is the same."""
        if self._search is not None:
            return self._search
        from deephyper.hpo import CBO, HpProblem

        logging.getLogger("deephyper").setLevel(logging.WARNING)
        problem = HpProblem()
        for name, values in self._dimensions.items():
            problem.add_hyperparameter([self._encode({name: v})[name] for v in values], name)
        n_points = self._settings.n_points
        if self._sampler is not None:
            problem.set_sampling_fn(self._sampler)
            n_points = min(n_points, len(self._sampler.table))
        self._log_dir = owned_tempdir("cbo")  # removed by a later run if this one is killed
        acq_optimizer_kwargs: dict[str, Any] = {"n_points": n_points, "max_total_failures": -1}
        surrogate: Any = self._settings.surrogate_model
        acq_func_kwargs: dict[str, Any] = {"kappa": self._settings.kappa}
        if self._settings.kappa_schedule is not None:
            acq_func_kwargs["scheduler"] = {"type": self._settings.kappa_schedule}
        extra: dict[str, Any] = {}
        if self._frame is not None:
            from parsearch.search.surrogate import EstimateSurrogate

            surrogate = EstimateSurrogate(self._frame)
            self._frame.items_of = self._items_of
            acq_optimizer_kwargs |= {"filter_failures": "ignore", "outliers_iqr_factor": np.inf}
            extra["objective_scaler"] = "identity"
        self._search = CBO(
            problem,
            random_state=self._seed,
            log_dir=str(self._log_dir),
            checkpoint_history_to_csv=False,
            surrogate_model=surrogate,
            acq_optimizer=self._settings.acq_optimizer,
            acq_optimizer_kwargs=acq_optimizer_kwargs,
            acq_func_kwargs=acq_func_kwargs,
            multi_point_strategy=self._settings.multi_point_strategy,
            n_initial_points=self._n_initial_points,
            **extra,
        )
        return self._search

    def _items_of(self, rows: np.ndarray) -> np.ndarray:
        """Which item each row of DeepHyper's transformed space is (``-1``: none). One row
        at a time: DeepHyper 0.13.2's ``Space.inverse_transform`` of several rows returns
        only the first when its dimensions are categorical with the identity transform
        (what it uses with a regressor of one's own)."""
        assert self._frame is not None
        space = self._search._opt_space
        names = space.dimension_names
        items = []
        for row in np.atleast_2d(rows):
            (values,) = space.inverse_transform(row[None, :])
            item = self._frame.item_of(self._decode(dict(zip(names, values, strict=True))))
            items.append(-1 if item is None else item)
        return np.array(items, dtype=int)

    def ask(self, n: int) -> list[Point]:
        """``n`` points (DeepHyper may repeat itself; the strategy dedupes)."""
        if n <= 0:
            return []
        with _quiet():
            search = self._cbo()
            if self._told:
                told, self._told = self._told, []
                search.tell(told)
            return [self._decode(point) for point in search.ask(n)]

    def tell(self, results: Sequence[tuple[Mapping[str, Any], Objective]]) -> None:
        """Objectives to maximise, or ``"F_<reason>"`` for failed points.

        Held until the next :meth:`ask`: DeepHyper refits its surrogate and scores its
        sampled points on every tell (most of the driver's time per trial at a few hundred
        trials), which only matters when it is asked; a strategy that asks it for one
        trial in three then pays for one refit, not three, with the same data.
        """
        self._told += [(self._encode(point), value) for point, value in results]

    def restrict(self, allowed: Sequence[Point]) -> None:
        """Draw from ``allowed`` from now on, in place of the points given at construction.

        For a strategy whose idea of what may run changes as trials come in (a calibrated
        memory estimate). DeepHyper draws the points it scores when it is told results,
        which happens at the next :meth:`ask`, so the change applies from then. No more
        than the number of points given at construction are scored per tell.
        """
        if self._sampler is None:
            raise ValueError("restrict() needs an optimizer built with allowed points")
        if allowed:
            self._sampler.table = self._table(allowed)

    def close(self) -> None:
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)

    def _table(self, points: Sequence[Point]) -> pd.DataFrame:
        return pd.DataFrame([self._encode(p) for p in points], columns=list(self.names))

    def _encode(self, point: Mapping[str, Any]) -> Point:
        return {
            name: self._codes[name][point[name]] if name in self._codes else point[name]
            for name in self.names
            if name in point
        }

    def _decode(self, point: Mapping[str, Any]) -> Point:
        return {
            name: self._values[name][int(point[name])] if name in self._values else point[name]
            for name in self.names
        }


class _PermutationSampler:
    """``sampling_fn`` for DeepHyper: rows of ``table``, a fresh permutation per pass.

    DeepHyper deep-copies the problem it is given; the copy keeps this very sampler (not a
    copy of it) so that :meth:`BayesianOptimizer.restrict` reaches the one it draws from.
    """

    def __init__(self, table: pd.DataFrame, seed: int):
        self.table = table
        self.rng = np.random.default_rng(seed)

    def __deepcopy__(self, memo: dict) -> _PermutationSampler:
        return self

    def __call__(self, size: int) -> pd.DataFrame:
        count = len(self.table)
        passes = -(-size // count)
        order = np.concatenate([self.rng.permutation(count) for _ in range(passes)])[:size]
        return self.table.iloc[order].reset_index(drop=True)


@contextlib.contextmanager
def _quiet():
    """DeepHyper warns when it re-proposes a point; the strategy handles that, silently."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
