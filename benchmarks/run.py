#!/usr/bin/env python
"""automodel-hydra benchmarks: our launcher against the plain alternative, as ratios measured side by side.

    python benchmarks/run.py --quick      # ~3-5 min on a 2-core machine
    python benchmarks/run.py              # more repetitions and the full 100 -> 1000 job plan (~15 min)

Prints one ``name=value`` line per figure, then a table and what each figure compares. This machine is shared and
noisy, so every figure is a ratio of two measurements taken in the same run, with A and B repetitions interleaved
(A B, then B A, ...) so that drift hits both alike; the ratio reported is the median of the per-pair ratios.

Figures (goal in brackets):

* ``launch_overhead_ratio`` [<= 1.15]: wall time, command to exit, of ``python train.py`` (one step, 2 ranks,
  no checkpoint) / the same job's worker command started by bare ``python -m torch.distributed.run``. Both run the
  identical worker (``python -m automodel_hydra.worker <job.yaml>``, the same job file: same model, data, one
  step, same torchrun flags); B's job file is made once beforehand by a dry run, outside the timing. So the ratio
  is exactly what ``train.py`` adds: Python + Hydra start-up, compose, validation, planning, writing ``launch/``,
  the ``bash torchrun.sh`` hop and the driver's wait/poll loop.
* ``sweep_packing_ratio`` [<= 0.7]: a 4-job, 1-rank sweep under our interactive launcher (jobs packed onto free
  cores) / the same sweep under Hydra's ``basic`` launcher (one job at a time, the stock alternative).
* ``array_plan_growth_ratio`` [<= 12]: dry-run planning time of a 10x larger Slurm sweep (1000 vs 100 jobs;
  --quick: 100 vs 10) -- linear growth gives ~10, less when fixed start-up counts; also seconds per job.
* ``ckpt_async_stall_ratio`` [<= 0.3]: training-thread time inside ``CheckpointManager.save`` with
  ``async_save=True`` / ``async_save=False``, same ~48 MB model+optimizer state (benchmarks/ckpt_stall.py).

Context (no goal): time to first training step (command start to the first ``metrics.jsonl`` line), peak RSS of
the driver process itself (kernel high-water mark ``VmHWM`` of the ``python train.py`` pid, polled from
/proc/PID/status while it runs: not its children) and, for contrast, of the largest process in its tree
(``ru_maxrss`` from ``wait4``, what ``/usr/bin/time -v`` reports: a worker rank), and CPU-time ratios (user+sys
of the whole process tree), which shared-machine load distorts far less than wall time.

Only the standard library is used here (and PyYAML, a dependency of the project); torch is imported by the
child processes alone. Run with the project's virtualenv's python.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import typing as tp
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
GOALS = {  # name -> (goal, "<=")
    "launch_overhead_ratio": 1.15,
    "sweep_packing_ratio": 0.7,
    "array_plan_growth_ratio": 12.0,
    "ckpt_async_stall_ratio": 0.3,
}
# one step, no checkpoint: the trivial job of launch_overhead_ratio
TRIVIAL = ["step_scheduler.max_steps=1", "checkpoint.enabled=false"]


# ----------------------------------------------------------------------------------------------- running things


@dataclasses.dataclass
class Run:
    """One timed command: wall time, process-tree CPU time and peak RSS, and when its first metrics line appeared."""

    argv: list[str]
    rc: int
    wall_s: float
    cpu_s: float  # user+sys of the command and every descendant it waited for
    tree_maxrss_mb: float  # largest single process of the tree (ru_maxrss of wait4)
    self_hwm_mb: float | None  # the command's own process: VmHWM, polled
    first_step_s: float | None  # command start -> first non-empty metrics file
    log: Path

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _vm_hwm_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def timed(argv: list[str], log: Path, *, env: dict[str, str] | None = None, metrics: tp.Sequence[Path] = (),
          timeout: float = 600.0) -> Run:
    """Run ``argv`` (cwd = repo root, output to ``log``) and measure it.

    The main thread blocks in ``os.wait4`` (exact end time and the tree's rusage); a monitor thread polls the
    process's ``VmHWM`` and the ``metrics`` files every 20 ms. On timeout the command gets SIGINT (our driver then
    stops its workers), then SIGKILL."""
    log.parent.mkdir(parents=True, exist_ok=True)
    done = threading.Event()
    hwm: list[int] = [0]
    first: list[float | None] = [None]
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def monitor() -> None:
            while not done.is_set():
                kb = _vm_hwm_kb(proc.pid)
                if kb:
                    hwm[0] = max(hwm[0], kb)
                if first[0] is None:
                    for m in metrics:
                        try:
                            if m.stat().st_size > 0:
                                first[0] = time.perf_counter() - t0
                                break
                        except OSError:
                            pass
                done.wait(0.02)

        def kill() -> None:
            for sig, grace in ((signal.SIGINT, 30), (signal.SIGKILL, 0)):
                try:
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    return
                if done.wait(grace):
                    return

        mon = threading.Thread(target=monitor, daemon=True)
        mon.start()
        timer = threading.Timer(timeout, kill)
        timer.daemon = True
        timer.start()
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        timer.cancel()
        done.set()
        mon.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
    return Run(argv, proc.returncode, wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024,
               hwm[0] / 1024 if hwm[0] else None, first[0], log)


def free_port() -> int:
    """A currently free TCP port in 20000..39999 (well away from the default 13742 that tests and users take)."""
    for _ in range(200):
        port = random.randrange(20000, 40000, 10)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port")


def median(xs: tp.Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


class Fail(RuntimeError):
    """A benchmarked command failed; the figure is reported as an error, the others still run."""

    def __init__(self, what: str, run: Run) -> None:
        super().__init__(f"{what} exited {run.rc} (log {run.log}):\n{run.tail()}")


def checked(what: str, run: Run) -> Run:
    if not run.ok:
        raise Fail(what, run)
    return run


def retry(what: str, fn: tp.Callable[[], Run]) -> Run:
    """Run once more when a run fails (a port taken by a concurrent user between check and bind, say)."""
    run = fn()
    if not run.ok:
        print(f"# note: {what} failed (rc {run.rc}); retrying once. Log: {run.log}", file=sys.stderr, flush=True)
        run = fn()
    return checked(what, run)


