"""Who am I: a rank's place in the trial, read from whichever launcher started it.

The node agent sets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT). Under ``mpiexec`` or ``srun`` the same program finds its place in
Open MPI's, MPICH's (PMI) or Slurm's variables instead, so it can be launched by any of them;
MASTER_ADDR and MASTER_PORT must then be exported to every rank (e.g. ``mpiexec -genv``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from parsearch.errors import TrainerError

# (rank, world size, local rank, local world size), in order of preference.
_LAUNCHERS: tuple[tuple[str, str, str, str], ...] = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> RankEnv:
        """Read the first launcher's variables that are present; a lone process (none set)
        is rank 0 of 1."""
        environ = os.environ if environ is None else environ
        rank, world, local, local_world = 0, 1, 0, 1
        for rank_var, world_var, local_var, local_world_var in _LAUNCHERS:
            if rank_var in environ and world_var in environ:
                rank, world = int(environ[rank_var]), int(environ[world_var])
                local = int(environ.get(local_var, rank))
                # Slurm may write "4(x2)" or "4,2": the first node's count is ours or equal.
                text = environ.get(local_world_var, str(world))
                local_world = int(text.split("(")[0].split(",")[0])
                break
        if not 0 <= rank < world:
            raise TrainerError(f"rank {rank} is outside world size {world}")
        port = environ.get("MASTER_PORT")
        if port is None and world > 1:
            raise TrainerError(
                f"MASTER_PORT is not set for rank {rank} of {world}: export MASTER_ADDR and "
                "MASTER_PORT to every rank (the node agent does this)"
            )
        return cls(
            rank=rank,
            world_size=world,
            local_rank=local,
            local_world_size=local_world,
            master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(port) if port is not None else None,
        )
