"""Nsight Systems: turn ``profile.nsys`` into an ``nsys profile`` argv prefix for one rank (pure).

Each rank writes its own report; the name carries node and rank through nsys's own substitutions (``%h`` =
hostname, ``%q{VAR}`` = an environment variable of the profiled process; "nsys profile --help", option
``--output``), so neither ranks nor attempts overwrite each other:
``<dir>/<job>_%h_rank%q{RANK}_attempt%q{TORCHELASTIC_RESTART_COUNT}.nsys-rep`` (:func:`nsys_prefix`).
"""

from __future__ import annotations

import typing as tp
from pathlib import Path

if tp.TYPE_CHECKING:
    from automodel_hydra.config import NsysConfig


def nsys_prefix(nsys: NsysConfig, output_dir: str | Path, job_name: str, rank_var: str = "RANK",
                attempt_vars: tp.Sequence[tuple[str, str]] = ()) -> list[str]:
    """``nsys profile ...`` arguments to put before the rank's command; ``[]`` when profiling is off.

    ``rank_var`` is the variable holding the global rank where nsys starts (``RANK`` under torchrun,
    ``SLURM_PROCID`` for srun tasks); ``attempt_vars`` are ``(label, variable)`` pairs naming the attempt where
    nsys starts (``("attempt", "TORCHELASTIC_RESTART_COUNT")`` under torchrun and ft_launcher, ``("requeue",
    "AUTOMODEL_REQUEUE")`` under Slurm), each added to the name as ``_<label><value>``: every attempt of a job keeps
    its own report (``--force-overwrite=true`` would otherwise let a restarted attempt replace the report of the
    attempt that hung, the one a user wants). The capture range is ``cudaProfilerApi``: the recipe calls
    ``torch.cuda.profiler.start/stop`` around steps ``start_step..stop_step``."""
    if not nsys.enabled:
        return []
    # a relative profile.nsys.output_dir is under the job's output dir (automodel_hydra.paths has the rule)
    attempt = "".join(f"_{label}%q{{{var}}}" for label, var in attempt_vars)
    out = Path(output_dir) / (nsys.output_dir or "") / f"{job_name}_%h_rank%q{{{rank_var}}}{attempt}"
    argv = ["nsys", "profile", f"--trace={nsys.trace}", "--capture-range=cudaProfilerApi",
            "--capture-range-end=stop", "--force-overwrite=true", f"--output={out}"]
    if nsys.delay_s is not None:
        argv.append(f"--delay={nsys.delay_s}")
    if nsys.duration_s is not None:
        argv.append(f"--duration={nsys.duration_s}")
    return argv + list(nsys.extra_args)


def missing_nsys_line(where: str) -> str:
    """The one line for ``profile=nsys`` without ``nsys`` ``where`` (``"on this machine"``, ``"on $(hostname)"``)."""
    return (f"profile.nsys.enabled=true (profile=nsys) but nsys (Nsight Systems) is not on PATH {where}: install "
            "Nsight Systems or load its module (e.g. module load nsight-systems), or set profile=none")


def nsys_check_lines(nsys: NsysConfig, log_file: str) -> list[str]:
    """Shell lines that stop the job at start with a clear error when ``nsys`` is not on PATH where it runs; the
    error goes to stderr and to the job log ``log_file`` (a bash word: quoted, or a ``"$VAR"/...`` expression), so
    ``automodel-hydra logs`` shows it too."""
    if not nsys.enabled:
        return []
    message = '"error: ' + missing_nsys_line("on $(hostname)") + '"'
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


class StepRange:
    """The Nsight Systems capture range ``profile.nsys.start_step..stop_step`` for a recipe that is not the bundled
    one (NeMo AutoModel's recipe classes, a user's function), which never calls the profiler API itself: steps are
    counted by the optimizer, through torch's public global hook
    (``torch.optim.optimizer.register_optimizer_step_post_hook``, as :mod:`automodel_hydra.heartbeat` counts them),
    so no recipe needs changing.

    Steps are 1-based optimizer steps (AutoModel's logs count from 0: its ``step 1`` is our step 2), the optimizer's
    own count where it keeps one (``state[p]["step"]``, restored with a checkpoint), else the calls of this process.
    ``cudaProfilerStart`` is called when step ``start_step - 1`` has completed (``start_step: 1``: at once, before
    the recipe starts, so its setup is captured too), ``cudaProfilerStop`` when ``stop_step`` has, and at
    :meth:`close` if the run ends inside the range. After a resume past ``start_step - 1`` the range starts after
    the first step. The CUDA calls happen only when ``cuda`` is true (``torch.cuda.is_available()`` by default);
    ``calls`` records ``("start"|"stop", step)`` either way, and rank 0 logs each."""

    def __init__(self, nsys: NsysConfig, rank: int = 0, cuda: bool | None = None) -> None:
        import torch

        self.nsys, self.rank = nsys, rank
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self.calls: list[tuple[str, int]] = []
        self.active = self.done = False
        self.count = 0
        self._handle: tp.Any = None

    def install(self) -> StepRange:
        import torch.optim.optimizer as optim

        self._handle = optim.register_optimizer_step_post_hook(self.hook)
        if self.nsys.start_step == 1:
            self._call("start", 1)
        return self

    def hook(self, optimizer: tp.Any, args: tp.Any, kwargs: tp.Any) -> None:
        """torch's step post-hook: step ``n`` has completed."""
        from automodel_hydra.heartbeat import optimizer_step

        self.count += 1
        done = optimizer_step(optimizer) or self.count
        if not self.active and not self.done and self.nsys.start_step <= done + 1 <= self.nsys.stop_step:
            self._call("start", done + 1)
        elif self.active and done >= self.nsys.stop_step:
            self._call("stop", done)

    def close(self) -> None:
        """Stop a capture still running and remove the hook."""
        if self.active:
            self._call("stop", self.count)
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _call(self, what: str, step: int) -> None:
        import logging

        import torch

        self.calls.append((what, step))
        self.active, self.done = what == "start", self.done or what == "stop"
        if self.rank == 0:
            where = f"before step {step}" if what == "start" else f"after step {step}"
            note = "" if self.cuda else " (no CUDA device: nothing for nsys to capture)"
            logging.getLogger(__name__).info("nsys capture range: cudaProfiler%s %s (profile.nsys.start_step=%d, "
                                             "stop_step=%d)%s", what.capitalize(), where, self.nsys.start_step,
                                             self.nsys.stop_step, note)
        if self.cuda:
            getattr(torch.cuda.profiler, what)()


def recipe_controls_range(recipe_sections: tp.Mapping[str, tp.Any]) -> bool:
    """Whether the recipe calls the profiler API itself: NeMo AutoModel's benchmark recipe does, from
    ``benchmark.nsys_start`` / ``nsys_end`` (0-based iterations, -1 = off; ``nemo_automodel/recipes/llm/
    benchmark.py``), and then its range is the one used."""
    bench = recipe_sections.get("benchmark")
    if not isinstance(bench, tp.Mapping):
        return False
    start = bench.get("nsys_start", -1)
    return isinstance(start, int) and not isinstance(start, bool) and start >= 0
