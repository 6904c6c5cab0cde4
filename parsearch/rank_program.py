"""What the rank programs parsearch ships (the built-in trainer, the machine probe) share
as trainer kinds: every rank runs ``python -m <module> --spec spec.json --out result.json``,
takes one device of its node where the trial runs on GPUs, and node 0's rank 0 writes the
trial's result, which concludes the node's."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from parsearch.launch.placement import NodePlacement
from parsearch.launch.plan import NodePlan, WarmStart
from parsearch.launch.process import NodeRun, read_tail
from parsearch.result import TrialResult, TrialState
from parsearch.trial import TrialSpec

SPEC_FILE = "spec.json"
RESULT_FILE = "result.json"


def uses_gpu(spec: TrialSpec) -> bool:
    """Whether the trial's ranks each take a GPU (backends size their slots by it)."""
    return spec.allocation.device != "cpu" and spec.trainer.get("device", "auto") != "cpu"


@dataclass(frozen=True)
class ResultFile:
    """Concludes a node from ``result.json``, written by rank 0 of node 0 (other nodes and
    failures: the agent's verdict). ``required``: a node 0 without the file failed (the
    built-in trainer always writes it); else it is ok without metrics."""

    required: bool = True

    def conclude(self, run: NodeRun, verdict: TrialResult) -> TrialResult:
        if verdict.status is not TrialState.OK or run.node_rank != 0:
            return verdict
        path = run.trial_dir / RESULT_FILE
        try:
            result = TrialResult.from_dict(json.loads(path.read_text()))
        except FileNotFoundError:
            if not self.required:
                return verdict
            return TrialResult(
                status=TrialState.ERROR,
                error=f"every rank exited 0 but rank 0 wrote no {RESULT_FILE}",
                log_tail=read_tail(run.ranks[0].log),
            )
        except (OSError, ValueError, KeyError) as exc:
            return TrialResult(
                status=TrialState.ERROR,
                error=f"unreadable {path}: {exc}",
                log_tail=read_tail(run.ranks[0].log),
            )
        result.log_tail = result.log_tail or verdict.log_tail
        return result


def rank_program_plan(
    placement: NodePlacement,
    module: str,
    *,
    entry: str | None = None,
    preload: tuple[str, ...] = (),
    required: bool = True,
) -> NodePlan:
    """Every rank of the node runs ``python -m module --spec ... --out ...``; with
    ``entry`` (``"module:function"``) it may instead be forked from a server that imported
    ``preload``, calling ``entry`` with the same arguments."""
    where = placement.trial_dir.resolve()
    args = ("--spec", str(where / SPEC_FILE), "--out", str(where / RESULT_FILE))
    return NodePlan(
        argv=[sys.executable, "-m", module, *args],
        files={SPEC_FILE: placement.spec.to_json()},
        bind_devices=uses_gpu(placement.spec),
        warm=WarmStart(preload, entry, args) if entry is not None else None,
        conclusion=ResultFile(required),
    )


__all__ = ["RESULT_FILE", "SPEC_FILE", "ResultFile", "rank_program_plan", "uses_gpu"]
