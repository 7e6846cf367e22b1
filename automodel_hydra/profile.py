"""Nsight Systems: turn ``profile.nsys`` into an ``nsys profile`` argv prefix for one rank (pure).

Each rank writes its own report; the name carries node and rank through nsys's own substitutions (``%h`` =
hostname, ``%q{VAR}`` = an environment variable of the profiled process; "nsys profile --help", option
``--output``), so ranks never overwrite each other: ``<dir>/<job>_%h_rank%q{RANK}.nsys-rep``.
"""

from __future__ import annotations

import typing as tp
from pathlib import Path

if tp.TYPE_CHECKING:
    from automodel_hydra.config import NsysConfig


def nsys_prefix(nsys: NsysConfig, output_dir: str | Path, job_name: str, rank_var: str = "RANK") -> list[str]:
    """``nsys profile ...`` arguments to put before the rank's command; ``[]`` when profiling is off.

    ``rank_var`` is the variable holding the global rank where nsys starts (``RANK`` under torchrun,
    ``SLURM_PROCID`` for srun tasks). The capture range is ``cudaProfilerApi``: the recipe calls
    ``torch.cuda.profiler.start/stop`` around steps ``start_step..stop_step``."""
    if not nsys.enabled:
        return []
    # a relative profile.nsys.output_dir is under the job's output dir (automodel_hydra.paths has the rule)
    out = Path(output_dir) / (nsys.output_dir or "") / f"{job_name}_%h_rank%q{{{rank_var}}}"
    argv = ["nsys", "profile", f"--trace={nsys.trace}", "--capture-range=cudaProfilerApi",
            "--capture-range-end=stop", "--force-overwrite=true", f"--output={out}"]
    if nsys.delay_s is not None:
        argv.append(f"--delay={nsys.delay_s}")
    if nsys.duration_s is not None:
        argv.append(f"--duration={nsys.duration_s}")
    return argv + list(nsys.extra_args)


def nsys_check_lines(nsys: NsysConfig, log_file: str) -> list[str]:
    """Shell lines that stop the job at start with a clear error when ``nsys`` is not on PATH where it runs; the
    error goes to stderr and to the job log ``log_file`` (a bash word: quoted, or a ``"$VAR"/...`` expression), so
    ``automodel-hydra logs`` shows it too."""
    if not nsys.enabled:
        return []
    message = ('"error: profile.nsys.enabled=true (profile=nsys) but nsys (Nsight Systems) is not on PATH on '
               '$(hostname): install Nsight Systems or load its module (e.g. module load nsight-systems)"')
    return [f"command -v nsys >/dev/null 2>&1 || {{ echo {message} | tee -a {log_file} >&2; exit 127; }}"]


#: Profiled runs longer than this many steps get a warning: nsys adds overhead and large reports.
LONG_PROFILED_RUN_STEPS = 200


def long_run_warning(nsys: NsysConfig, max_steps: int, time_limit_min: int | None = None) -> str | None:
    """A warning for a profiled run that is long (many steps or a long time limit); None when it is short."""
    if not nsys.enabled:
        return None
    long_steps = max_steps > LONG_PROFILED_RUN_STEPS
    long_time = time_limit_min is not None and time_limit_min > 60
    if not (long_steps or long_time):
        return None
    what = f"step_scheduler.max_steps={max_steps}" if long_steps else f"a {time_limit_min}-minute time limit"
    return (f"profiling a long run ({what}): nsys is diagnostic, adds overhead and writes large reports; capture "
            f"steps {nsys.start_step}..{nsys.stop_step} in a short run and profile=none for production training")
