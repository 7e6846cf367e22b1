"""The ``interactive:`` section's schema (:class:`InteractiveConfig`): torchrun on this node.

Pure: imports only :mod:`automodel_hydra.schema`, so :mod:`automodel_hydra.config` loads no backend;
:mod:`automodel_hydra.backends.interactive` plans and runs with it.
"""

from __future__ import annotations

import typing as tp
from dataclasses import dataclass

from automodel_hydra.schema import at_least, check_port, require


@dataclass
class InteractiveConfig:
    """torchrun on this node (``launcher=interactive``, the default)."""

    # workers on this node: "auto" = one per visible GPU, else one per CPU core; or an integer >= 1
    nproc_per_node: str = "auto"
    # rendezvous port; null = one the OS picks, so jobs sharing the host never collide (rank 0 logs it); a port
    # given here moves to the next free one when taken (logged)
    master_port: tp.Optional[int] = None
    # torchrun --max-restarts: restart the whole worker group this often after a worker fails
    max_restarts: int = 0
    # sweeps (-m): jobs run side by side on disjoint devices; null = as many as the devices allow
    max_parallel: tp.Optional[int] = None
    # not supported here: requeue is a Slurm feature (slurm.max_requeues); set only to get a clear error
    max_requeues: tp.Optional[int] = None

    def __post_init__(self) -> None:
        if self.nproc_per_node != "auto":
            ok = str(self.nproc_per_node).isdigit() and int(self.nproc_per_node) >= 1
            require(ok, "interactive.nproc_per_node", self.nproc_per_node, "'auto' or an integer >= 1")
        if self.master_port is not None:
            check_port("interactive.master_port", self.master_port)
        require(self.max_restarts >= 0, "interactive.max_restarts", self.max_restarts, "must be >= 0")
        at_least("interactive.max_parallel", self.max_parallel)
        require(self.max_requeues is None, "interactive.max_requeues", self.max_requeues,
                "requeue is a Slurm feature (launcher=slurm slurm.max_requeues=N); interactive runs restart "
                "failed workers with interactive.max_restarts")
