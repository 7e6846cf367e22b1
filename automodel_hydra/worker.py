"""What every rank runs, whichever launcher started it: ``python -m automodel_hydra.worker JOB_YAML``.

Reads the job's validated config (``launch/job.yaml``, written by the driver), initialises torch.distributed from
the launcher's environment (:mod:`automodel_hydra.bootstrap`), runs the recipe, and tears down.

Signals: SIGUSR2 (Slurm's time-limit warning, ``sbatch --signal=USR2@N``, or ``scancel --signal=USR2``) and
SIGTERM (preemption, Ctrl-C of torchrun) only set a flag; the recipe agrees on it across ranks at the next step
boundary, every rank checkpoints that same step, and the job exits. Under Slurm, rank 0 then requeues the job
(``scontrol requeue``, at most ``AUTOMODEL_MAX_REQUEUES`` times, counted by ``SLURM_RESTART_COUNT``) and the
requeued job resumes from that checkpoint by itself (``restore_from.path: latest``).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import typing as tp
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from automodel_hydra.bootstrap import DistEnv, init_distributed

log = logging.getLogger("automodel_hydra.worker")

#: Exit code of a rank that stopped early on a signal and was not requeued (128 + SIGTERM, as a shell reports it).
EXIT_STOPPED = 143


class StopFlag:
    """Set by SIGUSR2/SIGTERM; read by the recipe at step boundaries. Installing it replaces earlier handlers
    (submitit's included, whose rank-0-only checkpoint cannot coordinate a distributed save)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self, signums: tp.Iterable[int] = (signal.SIGUSR2, signal.SIGTERM)) -> StopFlag:
        for s in signums:
            signal.signal(s, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is None:
            log.warning("caught %s: checkpointing at the next step boundary", signal.Signals(signum).name)
        self.signum = signum

    def __call__(self) -> bool:
        return self.signum is not None


def stop_when_parent_dies(signum: int = signal.SIGTERM) -> None:
    """Have the kernel send ``signum`` to this rank when its parent dies (Linux ``PR_SET_PDEATHSIG``).

    issue 7: torchrun starts every rank in a session of its own, so when the agent is killed outright (SIGKILL, the
    OOM killer) nothing stops the ranks: they trained on unattended, writing into the run dir while a rerun started.
    With SIGTERM as the death signal they checkpoint at the next step boundary and exit, as on any stop signal."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    pr_set_pdeathsig = 1
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signum), 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: this rank will outlive a killed torchrun agent")
    elif os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signum)


def setup_logging(rank: int, log_file: str | None) -> None:
    """Rank 0 logs INFO to stderr and appends to the job log; other ranks log warnings to stderr and append only
    their errors to the job log (so a failing rank's traceback is in the log ``automodel-hydra logs`` shows)."""
    fmt = f"[%(asctime)s][rank{rank}][%(name)s][%(levelname)s] - %(message)s"
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        to_file = logging.FileHandler(log_file, mode="a")
        to_file.setLevel(logging.INFO if rank == 0 else logging.ERROR)
        handlers.append(to_file)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format=fmt, handlers=handlers,
                        force=True)


def slurm_requeue_target(environ: tp.Mapping[str, str]) -> str:
    """The id ``scontrol requeue`` needs: ``ARRAYJOB_TASK`` inside an array, else ``SLURM_JOB_ID``."""
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ["SLURM_JOB_ID"]


def requeues_left(environ: tp.Mapping[str, str] = os.environ) -> bool:
    """Whether this Slurm job may be requeued once more (the same answer on every rank)."""
    if "SLURM_JOB_ID" not in environ:
        return False
    return int(environ.get("SLURM_RESTART_COUNT", "0")) < int(environ.get("AUTOMODEL_MAX_REQUEUES", "0"))


def requeue(environ: tp.Mapping[str, str] = os.environ) -> None:
    """Ask Slurm to requeue this job (``scontrol requeue``); it restarts and resumes from its checkpoint."""
    target = slurm_requeue_target(environ)
    log.warning("requeuing Slurm job %s (restart %s of slurm.max_requeues=%s)", target,
                int(environ.get("SLURM_RESTART_COUNT", "0")) + 1, environ.get("AUTOMODEL_MAX_REQUEUES"))
    subprocess.run(["scontrol", "requeue", target], check=True)


def run(job_file: str | Path, log_file: str | None = None) -> dict[str, tp.Any]:
    """Run one rank of the job described by ``job_file``. Returns the recipe's final metrics.

    Raises SystemExit(EXIT_STOPPED) when a signal stopped training and the job was not requeued."""
    from omegaconf import OmegaConf

    from automodel_hydra import config
    from automodel_hydra.recipes import llm_finetune

    stop = StopFlag().install()
    if "TORCHELASTIC_RUN_ID" in os.environ:  # issue 7: started by torchrun
        stop_when_parent_dies()
    env = DistEnv.from_environ()
    setup_logging(env.rank, log_file)
    try:
        cfg = config.load_rank(OmegaConf.load(job_file))
        with init_distributed(env, timeout_minutes=cfg.dist_env.timeout_minutes) as dist_env:
            log.info("%r on %s", env, dist_env.device)
            result = llm_finetune.train(cfg, dist_env, should_stop=stop)
    except Exception:
        log.exception("rank %d failed", env.rank)
        raise
    if result.get("stopped_early"):
        if not requeues_left():
            log.warning("stopped at step %s on a signal; not requeued", result.get("step"))
            raise SystemExit(EXIT_STOPPED)
        if env.rank == 0:  # every rank has finished its checkpoint: the recipe waited for it
            requeue()
        return result
    if env.rank == 0:
        write_result(Path(cfg.output_dir) / "result.json", result)
    return result


def write_result(path: Path, result: dict[str, tp.Any]) -> None:
    """Rank 0's final metrics, written atomically: its presence means the job completed."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    os.replace(tmp, path)


@record  # torchrun prints this rank's traceback in its failure summary
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m automodel_hydra.worker", description=__doc__.splitlines()[0])
    parser.add_argument("job_file", help="the job's launch/job.yaml")
    parser.add_argument("--log-file", default=None, help="job log rank 0 appends to")
    args = parser.parse_args(argv)
    run(args.job_file, args.log_file)
    # skip the interpreter's final collection of torch/transformers objects (~1 s per rank at exit)
    gc.freeze()


if __name__ == "__main__":
    main()
