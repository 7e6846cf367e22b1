"""Nsight Systems: turn ``profile.nsys`` into an ``nsys profile`` argv prefix for one rank (pure).

Each rank writes its own report; the name carries node and rank through nsys's own substitutions (``%h`` =
hostname, ``%q{VAR}`` = an environment variable of the profiled process; "nsys profile --help", option
``--output``), so ranks never overwrite each other: ``<dir>/<job>_%h_rank%q{RANK}.nsys-rep``.
"""

from __future__ import annotations

from pathlib import Path

from automodel_hydra.config import NsysConfig


def nsys_prefix(nsys: NsysConfig, output_dir: str | Path, job_name: str, rank_var: str = "RANK") -> list[str]:
    """``nsys profile ...`` arguments to put before the rank's command; ``[]`` when profiling is off.

    ``rank_var`` is the variable holding the global rank where nsys starts (``RANK`` under torchrun,
    ``SLURM_PROCID`` for srun tasks). The capture range is ``cudaProfilerApi``: the recipe calls
    ``torch.cuda.profiler.start/stop`` around steps ``start_step..stop_step``."""
    if not nsys.enabled:
        return []
    out = Path(nsys.output_dir or output_dir) / f"{job_name}_%h_rank%q{{{rank_var}}}"
    argv = ["nsys", "profile", f"--trace={nsys.trace}", "--capture-range=cudaProfilerApi",
            "--capture-range-end=stop", "--force-overwrite=true", f"--output={out}"]
    if nsys.delay_s is not None:
        argv.append(f"--delay={nsys.delay_s}")
    if nsys.duration_s is not None:
        argv.append(f"--duration={nsys.duration_s}")
    return argv + list(nsys.extra_args)
