#!/usr/bin/env python
"""automodel-hydra benchmarks: our launcher against the plain alternative, as ratios measured side by side.

    .venv/bin/python benchmarks/run.py --quick   # < 6 min on 2 cores: extra pairs only while a 210 s budget lasts
    .venv/bin/python benchmarks/run.py           # 9/4/1/3 pairs, plans of 100 -> 1000 -> 10000 jobs (~15-25 min)

Prints one ``name=value`` line per figure, then a table and what each figure compares (progress goes to stderr).
The machine is shared and noisy, so every figure is a ratio of two measurements taken in the same run: A and B run
back to back as a pair, pair order alternates (A B, B A, ...), pairs of different figures are interleaved, and the
value reported is the median of the per-pair ratios.

Figures (goal in brackets):

* ``launch_overhead_ratio`` [<= 1.10]: wall time, command to exit, of ``python train.py`` (one step, 2 ranks,
  no checkpoint) / ``bash launch/torchrun.sh``, the script a dry run of the same config wrote. Both run the
  identical command (torchrun with the same flags, ``python -m automodel_hydra.worker <job.yaml>``, the same job
  file: same model, data, one step); B's script and job file are made once beforehand by a dry run, outside the
  timing. So the ratio is exactly what ``train.py`` adds: Python + Hydra start-up, compose, validation, planning,
  writing ``launch/`` and the driver's wait. torchrun's agent starts only once the plan is written (no early
  agent: benchmarks/README.md says why).
* ``sweep_packing_ratio`` [<= 0.7]: a 4-job, 1-rank sweep under our interactive launcher (jobs packed onto free
  cores) / the same sweep under Hydra's ``basic`` launcher (one job at a time, the stock alternative).
* ``array_plan_growth_ratio`` [<= 12]: dry-run planning time of a 10x larger Slurm sweep (1000 vs 100 jobs;
  --quick: 100 vs 10) -- linear growth gives ~10, less when fixed start-up counts; also seconds per job. Time is
  the CPU time of the planning process (one single-threaded, CPU-bound process: its wall time on an idle core);
  the wall-time ratio is printed next to it.
* ``ckpt_async_stall_ratio`` [<= 0.3]: training-thread time inside ``CheckpointManager.save`` with
  ``async_save=True`` / ``async_save=False``, same ~48 MB model+optimizer state (benchmarks/ckpt_stall.py).
* ``sweep_submit_ratio_vs_hsl`` [<= 0.25]: a 200-point Slurm sweep of train.py as a user writes it (``python
  train.py -m seed=range(0,200) launcher=slurm slurm.detach=true slurm.partition=debug slurm.gpus_per_node=0``:
  the launcher keys every real command has), timed from command start to the
  first ``sbatch`` call: our launcher, run as a user runs it (Hydra's default sweeper unless ``--ours-args`` says
  otherwise) / the same command with ``hydra/launcher=submitit_slurm`` (hydra-submitit-launcher). ``sbatch`` is a
  stand-in (``benchmarks/standins/sbatch``) that records the time of each call, submits nothing and prints a job
  id: no cluster is needed to time how long a launcher takes to get to its submission. The stock launcher is
  stopped right after its sbatch call (it would wait for results that never come).
* ``sweep_1000_submit_s`` [<= 20]: the same sweep at 1000 points, ours, start to first sbatch; and
  ``sweep_submit_peak_rss_mb`` [<= 100]: that process's peak RSS (``VmHWM``).
* ``sweep_command_form_ratio`` [<= 1.1]: that 200-point sweep, ours, start to first sbatch: the user's command
  (with ``slurm.partition=debug slurm.gpus_per_node=0``) / the same command without those two launcher keys. Every
  job of both takes the sweep fast path, so the two forms reach sbatch in the same time; ``*_cpu_*``: the
  submitting process's CPU seconds to that call.
* ``sweep_plan_growth_vs_linear`` [<= 1.25]: marginal planning cost per job of a plan-only Slurm sweep
  (``dry_run=true``) from 1000 to 10000 jobs, divided by the marginal cost from 100 to 1000 (--quick: 10 -> 100 ->
  1000): 1 is linear, more means each job costs more as the sweep grows.
* ``compose_speedup`` (no goal): per-job compose cost, Hydra's ``load_sweep_config`` / ``_compose``'s
  (benchmarks/compose_speed.py, in one process, every config checked equal to Hydra's).

Peers on the real Slurm test cluster (``peers``; scripts/slurm-cluster, started in the work dir and stopped after;
no goals): ``nemo_run_job_submit_ratio`` and ``nemo_run_sweep_submit_ratio``: command start -> the last real
``sbatch`` returned (a recording wrapper, ``benchmarks/recorders/sbatch``), ours / NeMo-Run (``nemo-run==0.11.1``
in ``.venv-nemo-run``, benchmarks/nemo_run_sweep.py: one ``run.Experiment``, one task per job, ``LocalTunnel``,
``exp.run(detach=True)``), for one job (run to its end and checked, beside a bare ``sbatch`` of our planned
script) and a 200-job sweep (20 with --quick, and NeMo-Run's 200 then estimated), with ``*_cpu_ratio`` the
submitting Python's CPU seconds; ``cluster_sweep_ratio_vs_hsl`` the same sweep against hydra-submitit-launcher.
Sweeps go to the partition set DOWN (queued, never run) and are cancelled after each side. Without NeMo-Run its
figures are skipped, naming benchmarks/setup-nemo-run; without the cluster's packages all peer figures are.

Our side of the scale figures is cut off at a cap on its own CPU seconds (--caps); a cut-off run gives a lower
bound, and a big run that the smaller runs predict to take more than twice its cap (or, with --quick, longer than
the time left) is not made: its figure is then an estimate. Both are marked (``>=``, ``~``) and never count as
meeting a goal.

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
import math
import os
import platform
import random
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
    "launch_overhead_ratio": 1.10,  # with no early agent: benchmarks/README.md, "Launch overhead: the goal"
    "sweep_packing_ratio": 0.7,
    "array_plan_growth_ratio": 12.0,
    "ckpt_async_stall_ratio": 0.3,
    "sweep_submit_ratio_vs_hsl": 0.25,
    "sweep_1000_submit_s": 20.0,
    "sweep_submit_peak_rss_mb": 100.0,
    "sweep_plan_growth_vs_linear": 1.25,
    "sweep_command_form_ratio": 1.1,
}
STANDINS = ROOT / "benchmarks" / "standins"  # sbatch stand-in: records when it is called, submits nothing
# one step, no checkpoint: the trivial job of launch_overhead_ratio
TRIVIAL = ["step_scheduler.max_steps=1", "checkpoint.enabled=false"]
#: the launcher keys every real Slurm command has (a partition, and the GPUs per node: none on CPU partitions),
#: given on the command line as a user gives them
USER_SLURM = ["slurm.partition=debug", "slurm.gpus_per_node=0"]


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
    self_cpu_s: float | None  # the command's own process: utime+stime, polled (last reading before it exited)
    first_step_s: float | None  # command start -> first non-empty metrics file
    log: Path
    child_s: tuple[float, float] | None = None  # first and last time (from start) a child process was seen alive
    start_epoch: float = 0.0  # time.time() just before the command started
    stopped: str = ""  # "": ran to its end; "timeout": cut off at its time limit; "stop_when": stopped when asked
    submit_s: float | None = None  # command start -> first call of the sbatch stand-in (Slurm sweep runs)
    submit_cpu_s: float | None = None  # CPU time (utime+stime) of the process that made that call, at the call
    load: float | None = None  # the 1-minute load average when the command started

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


_TICK = os.sysconf("SC_CLK_TCK")


def _self_cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15 of stat(5))
    except (OSError, IndexError, ValueError):
        return None


def _has_children(pid: int) -> bool:
    """Whether any thread of ``pid`` has a running (not yet exited: zombies do not count) child process
    (``/proc/PID/task/TID/children``, Linux >= 3.5)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids = f.read().split()
        except OSError:
            continue
        for kid in kids:
            try:
                with open(f"/proc/{kid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        return True
            except (OSError, IndexError):
                continue
    return False


def timed(argv: list[str], log: Path, *, env: dict[str, str] | None = None, metrics: tp.Sequence[Path] = (),
          timeout: float = 600.0, track_children: bool = False, stop_when: tp.Callable[[], bool] | None = None,
          kill_grace: float = 30.0, cpu_cap: float | None = None) -> Run:
    """Run ``argv`` (cwd = repo root, output to ``log``) and measure it.

    The main thread blocks in ``os.wait4`` (exact end time and the tree's rusage); every 20 ms a monitor thread
    polls the process's ``VmHWM`` and CPU time, the ``metrics`` files, (``track_children``) whether it has a
    running child and (``stop_when``) whether the command has done what is measured: then it gets SIGTERM, and
    SIGKILL 10 s later. On timeout, or once the command's own CPU time passes ``cpu_cap`` seconds (a limit that
    other users' load does not move), it gets SIGINT (our driver then stops its workers), then SIGKILL
    ``kill_grace`` seconds later. ``Run.stopped`` says which of these ended it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    done = threading.Event()
    hwm: list[int] = [0]
    self_cpu: list[float | None] = [None]
    child: list[float] = []  # first, last time a child was seen
    first: list[float | None] = [None]
    stopped: list[str] = [""]
    load = os.getloadavg()[0]
    with open(log, "wb") as out:
        t0, t0_epoch = time.perf_counter(), time.time()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def signal_until_done(*steps: tuple[int, float]) -> None:
            """Send each signal in turn, waiting its grace seconds for the run to end, until it has ended."""
            for sig, grace in steps:
                try:
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    return
                if done.wait(grace):
                    return

        def stop() -> None:
            signal_until_done((signal.SIGTERM, 10), (signal.SIGKILL, 0))

        def monitor() -> None:
            while not done.is_set():
                if stop_when is not None and not stopped[0] and stop_when():
                    stopped[0] = "stop_when"
                    threading.Thread(target=stop, daemon=True).start()
                if cpu_cap is not None and not stopped[0] and (self_cpu[0] or 0.0) > cpu_cap:
                    threading.Thread(target=kill, daemon=True).start()  # marks the run "timeout"
                kb = _vm_hwm_kb(proc.pid)
                if kb:
                    hwm[0] = max(hwm[0], kb)
                    self_cpu[0] = _self_cpu_s(proc.pid) or self_cpu[0]
                if track_children and _has_children(proc.pid):
                    now = time.perf_counter() - t0
                    child[:] = [child[0] if child else now, now]
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
            stopped[0] = stopped[0] or "timeout"
            signal_until_done((signal.SIGINT, kill_grace), (signal.SIGKILL, 0))

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
               hwm[0] / 1024 if hwm[0] else None, self_cpu[0], first[0], log, (child[0], child[1]) if child else None,
               t0_epoch, stopped[0], load=load)


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


@dataclasses.dataclass
class Figure:
    name: str
    value: float | None  # None = unavailable or failed
    a: str = ""  # what A / B measured, for the table
    b: str = ""
    reps: str = ""
    note: str = ""
    bound: str = ""  # "": measured; ">=": a lower bound (a run was cut off); "~": an estimate (a run was not made)

    @property
    def goal(self) -> float | None:
        return GOALS.get(self.name)

    @property
    def status(self) -> str:
        if self.goal is None:
            return ""
        if self.value is None:
            return "N/A"
        if self.bound and self.value <= self.goal:
            return "N/A"  # a lower bound or an estimate under the goal proves nothing
        return "ok" if self.value <= self.goal else "MISS"


def fmt(x: float | None, nd: int = 3) -> str:
    if x is None:
        return "unavailable"
    if math.isnan(x):
        return "nan"
    return f"{x:.{nd}g}" if abs(x) < 1000 else f"{x:.0f}"


def spread(xs: tp.Sequence[float]) -> str:
    return f"{min(xs):.3g}..{max(xs):.3g}" if len(xs) > 1 else ""


def progress(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- A/B pairs


@dataclasses.dataclass
class PairTask:
    """Repeated (A, B) measurements of one figure. Pair i runs A then B when i is even, B then A when odd, and the
    scheduler in :func:`main` interleaves the pairs of different tasks, so slow drift of the machine's load hits A
    and B alike."""

    name: str
    a: tp.Callable[[int], Run]
    b: tp.Callable[[int], Run]
    min_pairs: int
    max_pairs: int
    pairs: list[tuple[Run, Run]] = dataclasses.field(default_factory=list)
    last_s: float = 0.0
    error: str | None = None

    def run_pair(self) -> None:
        i, t0 = len(self.pairs), time.perf_counter()
        if i % 2 == 0:
            ra = self.a(i)
            rb = self.b(i)
        else:
            rb = self.b(i)
            ra = self.a(i)
        self.pairs.append((ra, rb))
        self.last_s = time.perf_counter() - t0
        progress(f"{self.name} pair {i + 1}: A {ra.wall_s:.1f}s B {rb.wall_s:.1f}s (wall), "
                 f"A {ra.cpu_s:.1f} B {rb.cpu_s:.1f} cpu-s, load {os.getloadavg()[0]:.1f}")

    def ratios(self, key: tp.Callable[[Run], float]) -> list[float]:
        return [key(a) / key(b) for a, b in self.pairs]

    def med(self, side: int, key: tp.Callable[[Run], float]) -> float:
        return median([key(p[side]) for p in self.pairs])


def wall(r: Run) -> float:
    return r.wall_s


def cpu(r: Run) -> float:
    return r.cpu_s


# ----------------------------------------------------------------------------------------------- the benchmarks


def launch_task(work: Path, min_pairs: int, max_pairs: int) -> tuple[PairTask, Run]:
    """A = ``python train.py`` (one step, 2 ranks); B = ``bash launch/torchrun.sh``, the script that A's dry run of
    the same config wrote (its dirs moved to B's own), with the same job file: the exact command A runs, started
    without A's Python, Hydra and planning. The rendezvous port is given as ``AUTOMODEL_RDZV_PORT``, the variable
    the script reads (what the interactive backend sets)."""
    # B's job file and exact script come from a dry run of the same config, made here, outside the timing
    proto = work / "launch-proto"
    dry = checked("dry run", timed([PY, "train.py", f"hydra.run.dir={proto}", *TRIVIAL, "interactive.nproc_per_node=2",
                                    "dry_run=true"], work / "logs" / "launch-dry.log"))
    job = yaml.safe_load((proto / "launch" / "job.yaml").read_text())
    script = (proto / "launch" / "torchrun.sh").read_text()

    def ours(i: int) -> Run:
        d = work / f"launch-ours-{i}"
        return retry("python train.py", lambda: timed(
            [PY, "train.py", f"hydra.run.dir={d}", *TRIVIAL, "interactive.nproc_per_node=2",
             f"interactive.master_port={free_port()}"],
            work / "logs" / f"launch-ours-{i}.log", metrics=[d / "metrics.jsonl"], track_children=True))

    def bare(i: int) -> Run:
        d = work / f"launch-bare-{i}"
        (d / "launch").mkdir(parents=True, exist_ok=True)
        job_file = d / "launch" / "job.yaml"
        job_file.write_text(yaml.safe_dump(dict(job, output_dir=str(d)), sort_keys=False))

        script_file = d / "launch" / "torchrun.sh"
        script_file.write_text(script.replace(str(proto), str(d)))
        assert str(job_file) in script_file.read_text(), script_file

        def run() -> Run:
            env = dict(os.environ, AUTOMODEL_RDZV_PORT=str(free_port()))
            return timed(["bash", str(script_file)], work / "logs" / f"launch-bare-{i}.log", env=env,
                         metrics=[d / "metrics.jsonl"])

        return retry("bash torchrun.sh", run)

    return PairTask("launch", ours, bare, min_pairs, max_pairs), dry


def launch_figures(t: PairTask, dry: Run) -> list[Figure]:
    ratios, cpu_ratios = t.ratios(wall), t.ratios(cpu)
    diffs = [a.wall_s - b.wall_s for a, b in t.pairs]
    firsts = [a.first_step_s for a, _ in t.pairs if a.first_step_s is not None]
    firsts_b = [b.first_step_s for _, b in t.pairs if b.first_step_s is not None]
    hwm = [a.self_hwm_mb for a, _ in t.pairs if a.self_hwm_mb]
    n = f"{len(t.pairs)} pairs"
    # the driver's own share of A, timed directly: start -> torchrun.sh spawned, plus its exit -> the driver's exit
    direct = [a.child_s[0] + (a.wall_s - a.child_s[1]) for a, _ in t.pairs if a.child_s]
    pre = [a.child_s[0] for a, _ in t.pairs if a.child_s]
    b_med = t.med(1, wall)
    return [
        Figure("launch_overhead_ratio", median(ratios), f"train.py {t.med(0, wall):.1f}s",
               f"bash torchrun.sh {t.med(1, wall):.1f}s", n, spread(ratios)),
        Figure("launch_overhead_s", median(diffs), "A - B, wall", "", n, spread(diffs)),
        Figure("launch_driver_overhead_s", median(direct) if direct else None,
               f"driver alone: start->spawn {median(pre):.2f}s + script exit->exit" if pre else "", "", n,
               spread(direct) if direct else ""),
        Figure("launch_overhead_ratio_direct", (b_med + median(direct)) / b_med if direct else None,
               "(B + driver alone) / B", "", n, "noise-robust cross-check"),
        Figure("launch_cpu_ratio", median(cpu_ratios), f"{t.med(0, cpu):.1f} cpu-s", f"{t.med(1, cpu):.1f} cpu-s", n,
               spread(cpu_ratios)),
        Figure("driver_cpu_s", median([a.self_cpu_s for a, _ in t.pairs if a.self_cpu_s is not None]),
               "utime+stime of the train.py process itself", "", n),
        Figure("driver_dry_run_s", dry.wall_s, "train.py dry_run=true: start, compose, plan, exit", "", "1"),
        Figure("time_to_first_step_s", median(firsts) if firsts else None, "train.py",
               f"bare {median(firsts_b):.1f}s" if firsts_b else "", f"{len(firsts)}"),
        Figure("driver_peak_rss_mb", max(hwm) if hwm else None, "VmHWM of the train.py process", "", f"{len(hwm)}"),
        Figure("tree_peak_rss_mb", max(a.tree_maxrss_mb for a, _ in t.pairs),
               "largest process of its tree (a rank)", "", f"{len(t.pairs)}"),
    ]


def sweep_task(work: Path, min_pairs: int, max_pairs: int, steps: int) -> PairTask:
    """4 one-rank jobs: our interactive launcher (packed) vs Hydra's basic launcher (one job at a time)."""
    common = ["-m", "seed=1,2,3,4", "interactive.nproc_per_node=1", f"step_scheduler.max_steps={steps}",
              "checkpoint.enabled=false"]

    def sweep(kind: str, extra: list[str]) -> tp.Callable[[int], Run]:
        def go(i: int) -> Run:
            d = work / f"sweep-{kind}-{i}"

            def once() -> Run:
                shutil.rmtree(d, ignore_errors=True)
                return timed([PY, "train.py", *common, *extra, f"hydra.sweep.dir={d}",
                              f"interactive.master_port={free_port()}"], work / "logs" / f"sweep-{kind}-{i}.log")

            run = retry(f"{kind} sweep", once)
            missing = [j for j in range(4) if not (d / str(j) / "result.json").exists()]
            if missing:
                raise Fail(f"{kind} sweep (jobs {missing} have no result.json)", run)
            return run

        return go

    return PairTask("sweep", sweep("packed", []), sweep("serial", ["hydra/launcher=basic"]), min_pairs, max_pairs)


def sweep_figures(t: PairTask) -> list[Figure]:
    ratios = t.ratios(wall)
    n = f"{len(t.pairs)} pairs"
    return [
        Figure("sweep_packing_ratio", median(ratios), f"packed {t.med(0, wall):.1f}s",
               f"one at a time {t.med(1, wall):.1f}s", n, spread(ratios)),
        Figure("sweep_cpu_ratio", median(t.ratios(cpu)), f"{t.med(0, cpu):.1f} cpu-s", f"{t.med(1, cpu):.1f} cpu-s",
               n, spread(t.ratios(cpu))),
    ]


def plan_task(work: Path, sizes: tuple[int, int], min_pairs: int, max_pairs: int) -> PairTask:
    """Dry-run planning of a Slurm sweep: A = the 10x bigger one, B = the small one."""
    small, big = sizes

    def plan(n: int) -> tp.Callable[[int], Run]:
        def go(i: int) -> Run:
            d = work / f"plan-{n}-{i}"
            run = checked(f"{n}-job Slurm dry run", timed(
                [PY, "train.py", "-m", "launcher=slurm", "slurm.partition=debug", "dry_run=true",
                 f"seed=range(0,{n})", f"hydra.sweep.dir={d}"], work / "logs" / f"plan-{n}-{i}.log", timeout=3600))
            planned = sum(1 for j in range(n) if (d / str(j) / "launch" / "job.yaml").exists())
            if planned != n:
                raise Fail(f"{n}-job Slurm dry run (planned {planned} job files)", run)
            shutil.rmtree(d, ignore_errors=True)
            return run
        return go

    return PairTask("plan", plan(big), plan(small), min_pairs, max_pairs)


def plan_figures(t: PairTask, sizes: tuple[int, int]) -> list[Figure]:
    small, big = sizes
    n = f"{len(t.pairs)} pairs"
    per_job = [(a.cpu_s - b.cpu_s) / (big - small) for a, b in t.pairs]
    per_job_wall = [(a.wall_s - b.wall_s) / (big - small) for a, b in t.pairs]
    return [
        Figure("array_plan_growth_ratio", median(t.ratios(cpu)), f"{big} jobs {t.med(0, cpu):.1f} cpu-s",
               f"{small} jobs {t.med(1, cpu):.1f} cpu-s", n, spread(t.ratios(cpu))),
        Figure("array_plan_growth_ratio_wall", median(t.ratios(wall)), f"{big} jobs {t.med(0, wall):.1f}s",
               f"{small} jobs {t.med(1, wall):.1f}s", n, spread(t.ratios(wall))),
        Figure("array_plan_s_per_job", median(per_job), f"marginal cpu-s/job, {small}->{big}",
               f"wall {median(per_job_wall):.3f} s/job", n),
        Figure("array_plan_driver_rss_mb", max(a.self_hwm_mb or 0 for a, _ in t.pairs), f"{big}-job dry run",
               f"{small} jobs: {max(b.self_hwm_mb or 0 for _, b in t.pairs):.0f} MB", n),
    ]


# ----------------------------------------------------------------------------------------------- sweeps at scale


def standin_env(record: Path) -> dict[str, str]:
    """This environment with the sbatch stand-in first on PATH; it appends each call's time to ``record``."""
    return dict(os.environ, PATH=f"{STANDINS}{os.pathsep}{os.environ.get('PATH', '')}",
                SBATCH_STANDIN_RECORD=str(record))


def slurm_sweep(work: Path, tag: str, n: int, extra: tp.Sequence[str], *, cap: float, stop_at_submit: bool,
                keys: tp.Sequence[str] = USER_SLURM) -> Run:
    """``python train.py -m seed=range(0,n) launcher=slurm slurm.detach=true KEYS EXTRA`` (``KEYS``: the user's
    launcher keys, :data:`USER_SLURM`) with the sbatch stand-in on
    PATH; ``Run.submit_s`` is command start -> the stand-in's first call. ``stop_at_submit``: stop the command
    then (Hydra's submitit launcher waits for the jobs' results, which never come). ``cap``: limit on the
    command's own CPU seconds (and 4x that, at least 600 s, of wall time); a run cut off there has
    ``stopped == "timeout"`` and no ``submit_s``."""
    d, record = work / tag, work / f"{tag}.sbatch-calls"
    shutil.rmtree(d, ignore_errors=True)
    record.unlink(missing_ok=True)
    run = timed([PY, "train.py", "-m", f"seed=range(0,{n})", "launcher=slurm", "slurm.detach=true", *keys,
                 f"hydra.sweep.dir={d}", *extra], work / "logs" / f"{tag}.log", env=standin_env(record),
                timeout=max(4 * cap, 600), cpu_cap=cap, stop_when=record.exists if stop_at_submit else None,
                kill_grace=5)
    calls = record.read_text().splitlines() if record.exists() else []
    shutil.rmtree(d, ignore_errors=True)
    if run.stopped == "timeout" and not calls:
        return run
    if not calls:
        raise Fail(f"{n}-point Slurm sweep ({tag}: the sbatch stand-in was never called)", run)
    if run.stopped != "stop_when" and not run.ok:
        raise Fail(f"{n}-point Slurm sweep ({tag})", run)
    epoch, cpu_s = calls[0].split()[:2]
    return dataclasses.replace(run, submit_s=float(epoch) - run.start_epoch,
                               submit_cpu_s=None if cpu_s == "-" else float(cpu_s))


def submit_task(work: Path, n: int, min_pairs: int, max_pairs: int, cap: float,
                ours_extra: tp.Sequence[str]) -> PairTask:
    """A = our launcher (``launcher=slurm``, Hydra's default sweeper unless ``ours_extra`` says otherwise), B =
    hydra-submitit-launcher (``hydra/launcher=submitit_slurm``) on the same command: an ``n``-point sweep, timed
    from command start to the first sbatch call. A is cut off at ``cap`` seconds."""
    def ours(i: int) -> Run:
        return slurm_sweep(work, f"submit-ours-{i}", n, ours_extra, cap=cap, stop_at_submit=False)

    def theirs(i: int) -> Run:
        return slurm_sweep(work, f"submit-hsl-{i}", n, ["hydra/launcher=submitit_slurm"], cap=max(cap, 600),
                           stop_at_submit=True)

    return PairTask("submit", ours, theirs, min_pairs, max_pairs)


def form_task(work: Path, n: int, min_pairs: int, max_pairs: int, cap: float,
              ours_extra: tp.Sequence[str]) -> PairTask:
    """``sweep_command_form_ratio``: A = the user's command (:data:`USER_SLURM` on the command line), B = the same
    sweep without those keys; both ours, an ``n``-point sweep, start to the first sbatch call."""
    def user(i: int) -> Run:
        return slurm_sweep(work, f"form-user-{i}", n, ours_extra, cap=cap, stop_at_submit=False)

    def bare(i: int) -> Run:
        return slurm_sweep(work, f"form-bare-{i}", n, ours_extra, cap=cap, stop_at_submit=False, keys=())

    return PairTask("form", user, bare, min_pairs, max_pairs)


def form_figures(t: PairTask, n: int) -> list[Figure]:
    cut = any(a.submit_s is None or b.submit_s is None for a, b in t.pairs)
    nt, bound = f"{len(t.pairs)} pairs", "~" if cut else ""
    loads = [r.load for p in t.pairs for r in p if r.load is not None]
    load = f"; load {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    return [
        Figure("sweep_command_form_ratio", median(t.ratios(submit_time)), f"with the keys {t.med(0, submit_time):.1f}s",
               f"without {t.med(1, submit_time):.1f}s", nt, f"{n} points, start -> first sbatch (stand-in) "
               f"{spread(t.ratios(submit_time))}{load}", bound=bound),
        Figure("sweep_command_form_cpu_ratio", median(t.ratios(submit_cpu)), f"{t.med(0, submit_cpu):.1f} cpu-s",
               f"{t.med(1, submit_cpu):.1f} cpu-s", nt, f"CPU of the submitting process to its sbatch call "
               f"{spread(t.ratios(submit_cpu))}", bound=bound),
    ]


def submit_time(r: Run) -> float:
    """Start -> first sbatch call; a run cut off before it counts as its cut-off time (so ratios are bounds)."""
    return r.submit_s if r.submit_s is not None else r.wall_s


def submit_cpu(r: Run) -> float:
    """CPU seconds of the submitting process up to its first sbatch call (when cut off: of the whole run)."""
    return r.submit_cpu_s if r.submit_cpu_s is not None else r.cpu_s


def submit_figures(t: PairTask, n: int, cap: float) -> list[Figure]:
    ratios = t.ratios(submit_time)
    cut = sum(1 for a, _ in t.pairs if a.submit_s is None)
    nt = f"{len(t.pairs)} pairs"
    ours_s, hsl_s = t.med(0, submit_time), t.med(1, submit_time)
    return [
        Figure("sweep_submit_ratio_vs_hsl", median(ratios), f"ours {ours_s:.1f}s", f"hydra-submitit-launcher "
               f"{hsl_s:.1f}s", nt, (f"ours cut off at {cap:.0f} cpu-s in {cut} pairs; " if cut else "") +
               f"{n} points, start -> first sbatch (stand-in) {spread(ratios)}", bound=">=" if cut else ""),
        Figure("sweep_submit_cpu_ratio_vs_hsl", median(t.ratios(submit_cpu)), f"{t.med(0, submit_cpu):.1f} cpu-s",
               f"{t.med(1, submit_cpu):.1f} cpu-s", nt, f"CPU of the submitting process, start -> first sbatch, "
               f"which other users' load moves least {spread(t.ratios(submit_cpu))}", bound=">=" if cut else ""),
    ]


def big_submit_figures(work: Path, n: int, cap: float, small: PairTask | None, small_n: int,
                       ours_extra: tp.Sequence[str], time_left: float) -> list[Figure]:
    """``sweep_1000_submit_s`` and ``sweep_submit_peak_rss_mb``: one ``n``-point sweep of ours, planned and
    submitted (to the stand-in). Not run when the ``small_n``-point runs of ``small`` predict more than twice
    ``cap`` or more than ``time_left`` (the --quick time limit): then both are estimates from those runs."""
    if small is not None and small.pairs:
        # overestimates (start-up counted n/small_n times): CPU against the cap, wall time against the time left
        est_cpu = median([submit_cpu(a) for a, _ in small.pairs]) * n / small_n
        est = median([submit_time(a) for a, _ in small.pairs]) * n / small_n
        cut_small = any(a.submit_s is None for a, _ in small.pairs)
        if cut_small or est_cpu > 2 * cap or est > time_left:
            hwm = max(a.self_hwm_mb or 0 for a, _ in small.pairs)
            why = (f"not run: the {small_n}-point runs were cut off" if cut_small else
                   f"not run: the {small_n}-point runs predict ~{est_cpu:.0f} cpu-s / ~{est:.0f} s, over "
                   + (f"2 x the {cap:.0f} cpu-s cap" if est_cpu > 2 * cap else "the --quick time left"))
            return [Figure(f"sweep_{n}_submit_s", est, f"~{n}/{small_n} x the {small_n}-point time", "", "0", why,
                           bound="~"),
                    Figure("sweep_submit_peak_rss_mb", hwm, f"VmHWM of the {small_n}-point runs", "", "0",
                           f"{n}-point run not made", bound=">=")]
    progress(f"{n}-point Slurm sweep (ours, sbatch stand-in), cap {cap:.0f} cpu-s")
    run = slurm_sweep(work, f"submit-{n}", n, ours_extra, cap=cap, stop_at_submit=False)
    cut = run.submit_s is None
    progress(f"{n}-point sweep: {'cut off at ' if cut else 'first sbatch at '}{submit_time(run):.1f}s, "
             f"VmHWM {run.self_hwm_mb or 0:.0f} MB, {run.cpu_s:.1f} cpu-s")
    note = (f"cut off at the {cap:.0f} cpu-s cap" if cut else
            f"{submit_cpu(run):.1f} cpu-s to the sbatch call; exit at {run.wall_s:.1f}s")
    return [Figure(f"sweep_{n}_submit_s", submit_time(run),
                   f"{n} points planned + submitted", "", "1", note, bound=">=" if cut else ""),
            Figure("sweep_submit_peak_rss_mb", run.self_hwm_mb, f"VmHWM of the {n}-point train.py process", "", "1",
                   "until cut off" if cut else "", bound=">=" if cut else "")]


def plan_only(work: Path, n: int, cap: float) -> tuple[Run, int]:
    """The plan task's command (a Slurm dry run) at ``n`` jobs, cut off at ``cap`` CPU seconds; also how many jobs
    Hydra had set up (``<job>/.hydra/config.yaml`` written) by the end."""
    d = work / f"plan-{n}-big"
    run = timed([PY, "train.py", "-m", "launcher=slurm", "slurm.partition=debug", "dry_run=true", f"seed=range(0,{n})",
                 f"hydra.sweep.dir={d}"], work / "logs" / f"plan-{n}-big.log", timeout=max(4 * cap, 600), cpu_cap=cap,
                kill_grace=5)
    done = sum(1 for j in range(n) if (d / str(j) / ".hydra" / "config.yaml").exists())
    shutil.rmtree(d, ignore_errors=True)
    if run.stopped != "timeout" and not run.ok:
        raise Fail(f"{n}-job Slurm dry run", run)
    return run, done


def growth_figures(work: Path, plan: PairTask, sizes: tuple[int, int], big: int, cap: float,
                   time_left: float) -> list[Figure]:
    """``sweep_plan_growth_vs_linear``: marginal planning cost per job from ``sizes[1]`` to ``big`` jobs divided by
    the marginal cost from ``sizes[0]`` to ``sizes[1]`` (the plan task's runs): 1 = linear, > 1 = each job costs
    more as the sweep grows. CPU time of the planning process. The ``big`` run is not made when the plan task's
    runs predict more than twice ``cap`` or more than ``time_left``; a run cut off at ``cap`` gives an estimate
    from the jobs it had set up by then."""
    small, mid = sizes
    t_small, t_mid = plan.med(1, cpu), plan.med(0, cpu)
    m1 = (t_mid - t_small) / (mid - small)
    est_cpu = t_mid + m1 * (big - mid)
    est_wall = est_cpu * max(1.0, plan.med(0, wall) / t_mid)  # this machine's load stretches wall time
    name = "sweep_plan_growth_vs_linear"
    span = f"marginal cpu-s/job {mid}->{big} / {small}->{mid}"
    if est_cpu > 2 * cap or est_wall > time_left:
        over = f"2 x the {cap:.0f} cpu-s cap" if est_cpu > 2 * cap else "the --quick time left"
        return [Figure(name, None, span, f"{small}->{mid}: {m1 * 1e3:.0f} ms/job", "0",
                       f"not run: {big} jobs would take ~{est_cpu:.0f} cpu-s / ~{est_wall:.0f} s, over {over}")]
    progress(f"{big}-job Slurm dry run (plan only), cap {cap:.0f} cpu-s")
    run, done = plan_only(work, big, cap)
    cut = run.stopped == "timeout"
    progress(f"{big}-job dry run: {run.cpu_s:.1f} cpu-s, {run.wall_s:.1f}s"
             + (f" (cut off after {done} jobs were set up)" if cut else ""))
    reached = done if cut else big
    if reached <= mid:
        return [Figure(name, None, span, "", "1", f"cut off at {cap:.0f} cpu-s after {done} jobs")]
    m2 = (run.cpu_s - t_mid) / (reached - mid)
    return [Figure(name, m2 / m1 if m1 > 0 else None, span, f"{m2 * 1e3:.1f} / {m1 * 1e3:.1f} ms/job", "1",
                   f"{big} jobs: {run.cpu_s:.0f} cpu-s, {run.wall_s:.0f}s wall" if not cut else
                   f"cut off at {cap:.0f} cpu-s: estimated from the {done} jobs set up by then",
                   bound="~" if cut else ""),
            Figure("sweep_plan_big_s_per_job", run.cpu_s / reached, f"{big}-job dry run, cpu-s/job", "", "1",
                   f"VmHWM {run.self_hwm_mb or 0:.0f} MB", bound="~" if cut else "")]


def compose_figures(work: Path) -> list[Figure]:
    """Per-job compose cost in one process: Hydra's ``load_sweep_config`` / ``_compose`` (benchmarks/compose_speed.py:
    200 jobs over 2 learning rates, CPU time, every job checked equal to Hydra's)."""
    run = checked("compose benchmark", timed([PY, str(ROOT / "benchmarks" / "compose_speed.py")],
                                             work / "logs" / "compose.log"))
    res = json.loads([ln for ln in run.log.read_text().splitlines() if ln.startswith("{")][-1])
    return [Figure("compose_speedup", res["speedup"], f"Hydra {res['hydra_ms_per_job']:.0f} ms/job",
                   f"_compose {res['ours_ms_per_job']:.1f} ms/job", f"{res['jobs']} jobs",
                   f"{res['composes']} Hydra compose(s), {res['fallbacks']} fallbacks, equal to Hydra's: "
                   f"{res['equal_to_hydra']}")]


def ckpt_figures(work: Path, rounds: int) -> list[Figure]:
    run = checked("checkpoint benchmark", timed(
        [PY, str(ROOT / "benchmarks" / "ckpt_stall.py"), "--rounds", str(rounds), "--dir", str(work / "ckpt")],
        work / "logs" / "ckpt.log"))
    res = json.loads([ln for ln in run.log.read_text().splitlines() if ln.startswith("{")][-1])
    return [
        Figure("ckpt_async_stall_ratio", res["ratio"], f"async {res['async_stall_s'] * 1e3:.0f} ms",
               f"sync {res['sync_stall_s'] * 1e3:.0f} ms", f"{rounds} round pairs",
               f"{spread(res['round_ratios'])}; {res['state_mb']:.0f} MB state"),
        Figure("ckpt_async_step_slowdown", res["async_step_slowdown"], "step time with the write in flight / without",
               "", ""),
    ]


# ----------------------------------------------------------------------------------------------- peers on Slurm

RECORDERS = ROOT / "benchmarks" / "recorders"  # sbatch wrapper: runs the real sbatch, records when it returned
NEMO_RUN_VENV = ROOT / ".venv-nemo-run"  # benchmarks/setup-nemo-run
PEER_SLURM = ["launcher=slurm", "slurm.partition=debug", "slurm.nodes=1", "slurm.ntasks_per_node=2",
              "slurm.detach=true"]  # our side on the test cluster: 1 node x 2 ranks (its nodes have 2 CPUs)


class Unavailable(RuntimeError):
    """A peer or the test cluster is not there: its figures are skipped, with this as the reason."""


def nemo_run_python() -> str:
    """NeMo-Run's interpreter: ``$NEMO_RUN_PYTHON`` when it is set (then only that one: a wrong path is a skip
    naming it, not a quiet fallback to another NeMo-Run), else ``.venv-nemo-run/bin/python``
    (benchmarks/setup-nemo-run), else this one when ``nemo_run`` imports here. Raises Unavailable naming the
    set-up command."""
    setup = "benchmarks/setup-nemo-run makes .venv-nemo-run with nemo-run==0.11.1"
    chosen = os.environ.get("NEMO_RUN_PYTHON")
    for py in [chosen] if chosen else [str(NEMO_RUN_VENV / "bin" / "python"), PY]:
        if Path(py).exists() and subprocess.run([py, "-c", "import nemo_run"], capture_output=True).returncode == 0:
            return py
    if chosen:
        raise Unavailable(f"NeMo-Run is not installed: NEMO_RUN_PYTHON={chosen} "
                          f"{'does not import nemo_run' if Path(chosen).exists() else 'does not exist'} "
                          f"(unset it to use .venv-nemo-run; {setup})")
    raise Unavailable(f"NeMo-Run is not installed: {setup}")


class TestCluster:
    """The project's Slurm test cluster (scripts/slurm-cluster: 2 nodes x 2 CPUs, partition ``debug``), started
    in a state dir of its own under the work dir (ports from ``$SLURM_CLUSTER_PORT_BASE``) and stopped by
    :meth:`down`; every command run through :attr:`env` talks to it and finds the recording ``sbatch`` first on
    PATH. Nothing else is touched: :meth:`cancel_all` cancels the jobs of this private cluster only."""

    def __init__(self, work: Path) -> None:
        self.dir = work / "slurm-cluster"
        os.chmod(work, 0o755)  # munged refuses a socket under a directory without o+x (mkdtemp makes 0700)
        script = ROOT / "scripts" / "slurm-cluster"
        env = dict(os.environ, SLURM_CLUSTER_DIR=str(self.dir))
        real = shutil.which("sbatch", path=os.environ.get("PATH", "") + ":/usr/bin")
        up = subprocess.run([str(script), "up"], env=env, capture_output=True, text=True, timeout=120)
        if up.returncode != 0 or real is None:
            said = (up.stderr.strip().splitlines() or ["(nothing)"])[-1]
            raise Unavailable(f"the Slurm test cluster did not start (scripts/slurm-cluster up exited {up.returncode}:"
                              f" {said}); scripts/install-slurm-deps installs its packages")
        self.script, self.cluster_env = script, env
        conf = self.dir / "etc" / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(conf), SBATCH_REAL=real,
                        PATH=f"{RECORDERS}{os.pathsep}{os.environ.get('PATH', '')}")

    def run(self, *argv: str) -> str:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, check=True, timeout=60).stdout

    def queued(self, job_ids: tp.Iterable[str] = ()) -> list[str]:
        ids = ",".join(job_ids)
        return self.run("squeue", "-h", "-o", "%i", *(["-j", ids] if ids else [])).split()

    def wait_gone(self, job_ids: tp.Sequence[str], timeout: float) -> float:
        """Poll squeue every 0.1 s until none of ``job_ids`` is queued or running; returns ``time.time()`` then."""
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            try:
                if not self.queued(job_ids):
                    return time.time()
            except subprocess.CalledProcessError:  # squeue -j of ids Slurm has already purged
                return time.time()
            time.sleep(0.1)
        raise RuntimeError(f"jobs {', '.join(job_ids)} still in the queue after {timeout:.0f} s")

    def partition(self, state: str) -> None:
        """``UP``, or ``DOWN``: jobs are still accepted and queued, but none starts (slurm.conf(5), State)."""
        self.run("scontrol", "update", "PartitionName=debug", f"State={state}")

    def cancel_all(self) -> None:
        self.run("scancel", "--partition=debug")
        until = time.monotonic() + 60
        while self.queued() and time.monotonic() < until:
            time.sleep(0.2)

    def down(self) -> None:
        subprocess.run([str(self.script), "down"], env=self.cluster_env, capture_output=True, timeout=120)


def cluster_submit(cluster: TestCluster, work: Path, tag: str, argv: list[str], calls: int, *,
                   stop: bool = False, timeout: float = 900.0) -> tuple[Run, list[str]]:
    """Run a submitting command against the test cluster; ``Run.submit_s``: command start -> the ``calls``-th
    real sbatch returned, ``Run.submit_cpu_s``: the submitting Python's CPU seconds then (its reaped children
    included). ``stop``: stop the command once that many calls are in (hydra-submitit-launcher waits for results).
    Returns the run and the job ids sbatch gave; raises Fail when the command or a sbatch call failed."""
    record = work / f"{tag}.sbatch-calls"
    record.unlink(missing_ok=True)

    def n_calls() -> int:
        try:
            return len(record.read_text().splitlines())
        except OSError:
            return 0

    run = timed(argv, work / "logs" / f"{tag}.log", env=dict(cluster.env, SBATCH_RECORD=str(record)),
                timeout=timeout, stop_when=(lambda: n_calls() >= calls) if stop else None, kill_grace=5)
    rows = [ln.split() for ln in (record.read_text().splitlines() if record.exists() else [])]
    if run.stopped != "stop_when" and not run.ok:
        raise Fail(f"{tag}", run)
    if len(rows) < calls or any(r[2] != "0" for r in rows):
        raise Fail(f"{tag} (expected {calls} successful sbatch calls, recorded {[r[2] for r in rows]})", run)
    last = rows[calls - 1]
    return dataclasses.replace(run, submit_s=float(last[0]) - run.start_epoch,
                               submit_cpu_s=None if last[1] == "-" else float(last[1])), [r[3] for r in rows]


def peer_figures(work: Path, quick: bool, job_rounds: int, points: int) -> list[Figure]:
    """Peers on the real Slurm test cluster, each run as its users run it, side by side in rounds whose order
    rotates: one job (ours, NeMo-Run, a bare ``sbatch`` of our planned script), each run to its end and checked;
    then a ``points``-job sweep (ours, NeMo-Run, hydra-submitit-launcher) submitted to the partition set DOWN, so
    jobs queue but none runs, cancelled after each side. Figures: submit time (command start -> its last sbatch
    returned) and CPU of the submitting process, ours / theirs. ``--quick`` runs the sweeps at ``points`` (20)
    and ours once more at 200; NeMo-Run's 200-job time is then an estimate (``~``) from its 1- and 20-job
    runs (linear in the tasks: one package and one sbatch per task)."""
    try:
        nemo_py: str | None = nemo_run_python()
        nemo_why = ""
    except Unavailable as e:
        nemo_py, nemo_why = None, str(e)
    cluster = TestCluster(work)  # Unavailable: every peer figure is skipped
    try:
        return _peer_figures(cluster, work, quick, job_rounds, points, nemo_py, nemo_why)
    finally:
        cluster.down()


def _peer_figures(cluster: TestCluster, work: Path, quick: bool, job_rounds: int, points: int,
                  nemo_py: str | None, nemo_why: str) -> list[Figure]:
    # untimed: our interactive plan gives the bare torchrun script NeMo-Run's tasks run; our Slurm plan gives the
    # script the bare sbatch submits (both from dry runs of the trivial job)
    proto_t, proto_s = work / "peer-proto-torchrun", work / "peer-proto-slurm"
    checked("dry run", timed([PY, "train.py", f"hydra.run.dir={proto_t}", *TRIVIAL, "interactive.nproc_per_node=2",
                              "dry_run=true"], work / "logs" / "peer-dry-torchrun.log"))
    checked("dry run", timed([PY, "train.py", f"hydra.run.dir={proto_s}", *TRIVIAL, *PEER_SLURM, "dry_run=true"],
                             work / "logs" / "peer-dry-slurm.log", env=cluster.env))
    torchrun_sh = (proto_t / "launch" / "torchrun.sh").read_text()
    job = yaml.safe_load((proto_t / "launch" / "job.yaml").read_text())

    def torchrun_job(d: Path, seed: int | None = None) -> str:
        """A job dir holding the trivial job's job.yaml; returns the bare torchrun script that runs it."""
        (d / "launch").mkdir(parents=True, exist_ok=True)
        spec = dict(job, output_dir=str(d)) | ({} if seed is None else {"seed": seed})
        (d / "launch" / "job.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        return torchrun_sh.replace(str(proto_t), str(d))

    def nemo_run(tag: str, commands: list[str]) -> tuple[Run, list[str]]:
        assert nemo_py is not None
        spec = work / f"{tag}.json"
        spec.write_text(json.dumps({"base_dir": str(work / tag), "partition": "debug", "cpus_per_task": 2,
                                    "commands": commands}))
        return cluster_submit(cluster, work, tag, [nemo_py, str(ROOT / "benchmarks" / "nemo_run_sweep.py"),
                                                   str(spec)], len(commands))

    def finished(run: Run, ids: list[str], out: Path, what: str) -> float:
        """Wait for the job to leave the queue; seconds from command start; Fail unless it wrote its result."""
        end = cluster.wait_gone(ids, 300) - run.start_epoch
        if not (out / "result.json").exists():
            raise Fail(f"{what}: the job ended without writing {out / 'result.json'}", run)
        return end

    jobs: dict[str, list[tuple[Run, float]]] = {"ours": [], "nemo": [], "bare": []}
    sides = ["ours", "bare"] + (["nemo"] if nemo_py else [])
    for i in range(job_rounds):
        for side in sides[i % len(sides):] + sides[:i % len(sides)]:
            d = work / f"peer-job-{side}-{i}"
            if side == "ours":
                run, ids = cluster_submit(cluster, work, f"peer-job-ours-{i}",
                                          [PY, "train.py", f"hydra.run.dir={d}", *TRIVIAL, *PEER_SLURM], 1)
            elif side == "nemo":
                run, ids = nemo_run(f"peer-job-nemo-{i}", [torchrun_job(d)])
            else:
                shutil.copytree(proto_s, d)
                (d / "slurm").mkdir(exist_ok=True)  # the script's --output dir, which our submit makes
                for f in (d / "launch" / "sbatch.sh", d / "launch" / "job.yaml"):
                    f.write_text(f.read_text().replace(str(proto_s), str(d)))
                run, ids = cluster_submit(cluster, work, f"peer-job-bare-{i}",
                                          ["sbatch", "--parsable", str(d / "launch" / "sbatch.sh")], 1)
                run = dataclasses.replace(run, submit_cpu_s=run.cpu_s)  # sbatch itself is the whole tree
            jobs[side].append((run, finished(run, ids, d, f"{side} job")))
            progress(f"peers: one job, {side}: submitted at {run.submit_s:.2f}s ({run.submit_cpu_s or 0:.2f} cpu-s), "
                     f"done at {jobs[side][-1][1]:.1f}s, load {os.getloadavg()[0]:.1f}")

    cluster.partition("DOWN")
    sweeps: dict[str, dict[int, list[Run]]] = {"ours": {}, "nemo": {}, "hsl": {}}
    try:
        sizes = [points] + ([200] if quick and points != 200 else [])
        for n in sizes:
            for side in (["ours", "hsl"] + (["nemo"] if nemo_py else [])) if n == points else ["ours"]:
                d, tag = work / f"peer-sweep-{side}-{n}", f"peer-sweep-{side}-{n}"
                sweep = [PY, "train.py", "-m", f"seed=range(0,{n})", f"hydra.sweep.dir={d}", *TRIVIAL]
                if side == "ours":
                    run, _ = cluster_submit(cluster, work, tag, [*sweep, *PEER_SLURM], 1)
                elif side == "hsl":
                    run, _ = cluster_submit(cluster, work, tag, [*sweep, "hydra/launcher=submitit_slurm",
                                                                 "hydra.launcher.partition=debug"], 1, stop=True)
                else:
                    run, _ = nemo_run(tag, [torchrun_job(d / str(j), seed=j) for j in range(n)])
                queued = len(cluster.queued())
                cluster.cancel_all()
                sweeps[side].setdefault(n, []).append(run)
                progress(f"peers: {n}-job sweep, {side}: last sbatch at {run.submit_s:.1f}s "
                         f"({run.submit_cpu_s or 0:.1f} cpu-s), {queued} jobs/arrays queued, load "
                         f"{os.getloadavg()[0]:.1f}")
    finally:
        cluster.partition("UP")

    def med(side: str, key: tp.Callable[[Run], float | None]) -> float:
        return median([v for r, _ in jobs[side] if (v := key(r)) is not None])

    s = lambda r: r.submit_s  # noqa: E731
    c = lambda r: r.submit_cpu_s  # noqa: E731
    nj = f"{job_rounds} rounds"
    done = {k: median([e for _, e in v]) for k, v in jobs.items() if v}
    out = [Figure("cluster_job_submit_s", med("ours", s), f"ours {med('ours', c):.2f} cpu-s",
                  f"bare sbatch {med('bare', s):.2f}s", nj,
                  f"start -> sbatch returned; done (left the queue) at {done['ours']:.1f}s, bare {done['bare']:.1f}s")]
    sw = lambda side, n: sweeps[side].get(n, [])  # noqa: E731
    ours_n, hsl_n = sw("ours", points), sw("hsl", points)
    out.append(Figure("cluster_sweep_ratio_vs_hsl", ours_n[0].submit_s / hsl_n[0].submit_s,
                      f"ours {ours_n[0].submit_s:.1f}s", f"hydra-submitit-launcher {hsl_n[0].submit_s:.1f}s", "1",
                      f"{points} jobs, real sbatch, start -> last sbatch returned; cpu "
                      f"{ours_n[0].submit_cpu_s or 0:.1f} / {hsl_n[0].submit_cpu_s or 0:.1f}"))
    if nemo_py is None:
        return [*out, Figure("nemo_run_job_submit_ratio", None, note=f"skipped: {nemo_why}"),
                Figure("nemo_run_sweep_submit_ratio", None, note=f"skipped: {nemo_why}")]
    nemo_n = sw("nemo", points)
    out += [
        Figure("nemo_run_job_submit_ratio", median([a.submit_s / b.submit_s for (a, _), (b, _) in
                                                    zip(jobs["ours"], jobs["nemo"])]),
               f"ours {med('ours', s):.2f}s", f"NeMo-Run {med('nemo', s):.2f}s", nj,
               f"one job, start -> sbatch returned; NeMo-Run's job done at {done['nemo']:.1f}s"),
        Figure("nemo_run_job_submit_cpu_ratio", median([(a.submit_cpu_s or 0) / (b.submit_cpu_s or 1) for (a, _), (b, _)
                                                        in zip(jobs["ours"], jobs["nemo"])]),
               f"{med('ours', c):.2f} cpu-s", f"{med('nemo', c):.2f} cpu-s", nj, "CPU of the submitting Python"),
        Figure("nemo_run_sweep_submit_ratio", ours_n[0].submit_s / nemo_n[0].submit_s,
               f"ours {ours_n[0].submit_s:.1f}s", f"NeMo-Run {nemo_n[0].submit_s:.1f}s", "1",
               f"{points} jobs: one array / {points} sbatch calls"),
        Figure("nemo_run_sweep_submit_cpu_ratio", (ours_n[0].submit_cpu_s or 0) / (nemo_n[0].submit_cpu_s or 1),
               f"{ours_n[0].submit_cpu_s or 0:.1f} cpu-s", f"{nemo_n[0].submit_cpu_s or 0:.1f} cpu-s", "1",
               f"{points} jobs"),
    ]
    if sw("ours", 200) and points != 200:  # --quick: NeMo-Run's 200-job time from its 1- and `points`-job runs
        one, many = med("nemo", s), nemo_n[0].submit_s
        est = many + (many - one) / (points - 1) * (200 - points)
        ours200 = sw("ours", 200)[0].submit_s
        out += [Figure("nemo_run_sweep_200_submit_s", est, f"~ {points} jobs {many:.1f}s + "
                       f"{(many - one) / (points - 1):.2f}s per task", "", "0",
                       "an estimate: 200 NeMo-Run tasks not run with --quick", bound="~"),
                Figure("nemo_run_sweep_200_ratio", ours200 / est, f"ours {ours200:.1f}s (measured)",
                       f"NeMo-Run ~{est:.0f}s", "1", "", bound="~")]
    else:
        out.append(Figure(f"nemo_run_sweep_{points}_submit_s", nemo_n[0].submit_s, f"NeMo-Run, {points} tasks", "",
                          "1"))
    return out


# ----------------------------------------------------------------------------------------------- report

NOTES = """\
What is compared (A / B; medians of per-pair ratios, A and B of a pair run back to back, pair order alternating):
  launch_overhead_ratio    A = python train.py: Hydra start-up and compose, validation, planning, writing launch/,
                           bash launch/torchrun.sh, torchrun, the driver's wait. B = bash launch/torchrun.sh, the
                           script a dry run of the same config wrote (beforehand, untimed), on the same job.yaml:
                           same torchrun flags, 2 ranks, model, data, one step, no checkpoint. So B is "the same
                           trivial work" and A - B is exactly what the launcher adds.
  sweep_packing_ratio      A = our interactive launcher: 4 one-rank jobs, packed 2 at a time onto the 2 cores.
                           B = the same 4 jobs under hydra/launcher=basic (Hydra's stock launcher): one at a time.
  array_plan_growth_ratio  python train.py -m launcher=slurm dry_run=true seed=range(0,N) at 10x the jobs / at N.
                           Time = CPU time (user+sys) of the planning process: planning is one single-threaded,
                           CPU-bound process, so that is its wall time on an idle core; the wall ratio
                           (*_wall), which here mostly tracks other users' load during the long run, is shown too.
  ckpt_async_stall_ratio   time the training thread spends inside CheckpointManager.save(): async_save=True /
                           False, same state, rounds interleaved (benchmarks/ckpt_stall.py).
  sweep_submit_ratio_vs_hsl  python train.py -m seed=range(0,200) launcher=slurm slurm.detach=true
                           slurm.partition=debug slurm.gpus_per_node=0 (as a user writes it), start to the
                           first sbatch call (a stand-in on PATH that records the time and prints a job id):
                           A = our launcher (Hydra's default sweeper unless --ours-args), B = the same command
                           with hydra/launcher=submitit_slurm (hydra-submitit-launcher), stopped at its sbatch.
                           *_cpu_*: the submitting process's own CPU seconds up to that call (the stand-in reads
                           them from /proc/PPID/stat), which other users' load moves far less than wall time.
  sweep_1000_submit_s      the same at 1000 points, ours; sweep_submit_peak_rss_mb = its VmHWM.
  sweep_command_form_ratio  that 200-point sweep, ours, start to first sbatch: the user's command (with
                           slurm.partition=debug slurm.gpus_per_node=0) / the same without those two keys.
  sweep_plan_growth_vs_linear  plan-only (dry_run=true) Slurm sweeps: marginal cpu-s per job from the middle to
                           the biggest size / from the smallest to the middle (1 = linear).
  compose_speedup          per-job CPU of Hydra's load_sweep_config / _compose's copy-and-apply, one process.
  cluster_job_submit_s     peers, on the real Slurm test cluster: python train.py launcher=slurm slurm.detach=true
                           (one job, 2 ranks), start -> sbatch returned (benchmarks/recorders/sbatch), beside a bare
                           `sbatch` of the script our dry run planned; each job runs to its end and is checked.
  nemo_run_*_ratio         ours / NeMo-Run (run.Experiment, one task per job, SlurmExecutor + LocalTunnel,
                           GitArchivePackager by default, exp.run(detach=True)): start -> its last sbatch returned;
                           *_cpu_*: the submitting Python's CPU seconds then, reaped children included. Sweeps go
                           to the partition set DOWN (queued, never run), cancelled after each side.
  cluster_sweep_ratio_vs_hsl  the same sweep, ours / hydra-submitit-launcher, real sbatch.
  >= / ~                   a lower bound (our run was cut off at its cap) / an estimate (the run was not made).
  *_cpu_ratio              user+sys CPU of the whole process tree, which other users' load barely moves.
  driver_peak_rss_mb       VmHWM (the kernel's peak-RSS mark) of the python train.py process alone, polled from
                           /proc/PID/status; tree_peak_rss_mb = ru_maxrss from wait4, the largest process of the
                           tree (a worker rank), which is what /usr/bin/time -v reports for the command."""


def table(figures: list[Figure]) -> str:
    rows = [("figure", "value", "goal", "", "A", "B", "n", "spread / note")]
    for f in figures:
        rows.append((f.name, fmt(f.value), f"<= {f.goal:g}" if f.goal else "", f.status, f.a, f.b, f.reps, f.note))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if j == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- main

RATIO_OF = {"ckpt": "ckpt_async_stall_ratio", "launch": "launch_overhead_ratio", "sweep": "sweep_packing_ratio",
            "plan": "array_plan_growth_ratio", "submit": "sweep_submit_ratio_vs_hsl",
            "bigsubmit": "sweep_1000_submit_s", "growth": "sweep_plan_growth_vs_linear",
            "compose": "compose_speedup", "peers": "nemo_run_sweep_submit_ratio", "form": "sweep_command_form_ratio"}
ORDER = ("launch", "sweep", "plan", "submit", "form", "bigsubmit", "growth", "compose", "ckpt", "peers")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="one mandatory round, then more pairs only while the time budget lasts; plan 10 -> 100 "
                         "(-> 1000 for the growth figure) jobs; runs of ours cut off at short caps")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds after which no optional pair is started (default: 210 with --quick, none without)")
    ap.add_argument("--only", default="ckpt,launch,sweep,plan,submit,form,growth,compose,peers",
                    help="comma list of: ckpt,launch,sweep,plan,submit (ratio vs hydra-submitit-launcher, 1000-point "
                         "submit, peak RSS),form (the user's sweep command with launcher keys / without them),"
                         "growth (needs plan),compose (per-job compose: Hydra vs _compose),peers "
                         "(NeMo-Run, hydra-submitit-launcher and bare sbatch on the Slurm test cluster)")
    ap.add_argument("--pairs", default=None,
                    help="LAUNCH,SWEEP,PLAN,SUBMIT maximum pairs (default: --quick 7,3,1,3 with minimums 1,1,1,1; "
                         "else 9,4,1,3); SUBMIT is also the form figure's")
    ap.add_argument("--plan-sizes", default=None, help="SMALL,BIG job counts (default 100,1000; --quick 10,100); "
                                                       "the growth figure adds 10 x BIG")
    ap.add_argument("--submit-points", type=int, default=200, help="points of the sweep_submit_ratio_vs_hsl sweep")
    ap.add_argument("--big-points", type=int, default=1000, help="points of the sweep_1000_submit_s sweep")
    ap.add_argument("--peer-points", type=int, default=None,
                    help="jobs of the peers' sweeps on the test cluster (default 200; --quick 20, and ours once more "
                         "at 200)")
    ap.add_argument("--peer-rounds", type=int, default=None, help="one-job rounds of the peers (default 3; --quick 1)")
    ap.add_argument("--ours-args", default="",
                    help="extra train.py arguments for our side of the submit figures, e.g. "
                         "'hydra/sweeper=automodel_basic' (space-separated)")
    ap.add_argument("--caps", default=None,
                    help="PAIR,BIG,GROWTH caps on the CPU seconds of our side of the submit pair, the 1000-point "
                         "submit and the biggest plan-only run (default: --quick 60,60,90; else 300,600,1800)")
    ap.add_argument("--sweep-steps", type=int, default=1, help="training steps per sweep job")
    ap.add_argument("--json", default=None, help="also write every figure to this JSON file")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs, job dirs)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a ratio misses its goal or is unavailable")
    args = ap.parse_args(argv)
    q = args.quick
    budget = args.budget if args.budget is not None else (210.0 if q else float("inf"))
    deadline = budget + 90.0  # --quick: no one-off big run is started that would end past this (seconds from start)
    max_pairs = [int(x) for x in (args.pairs or ("7,3,1,3" if q else "9,4,1,3")).split(",")]
    assert len(max_pairs) == 4, "--pairs takes LAUNCH,SWEEP,PLAN,SUBMIT"
    min_pairs = [min(m, x) for m, x in zip((1, 1, 1, 1) if q else max_pairs[:3] + [1], max_pairs)]
    sizes = tuple(int(x) for x in (args.plan_sizes or ("10,100" if q else "100,1000")).split(","))
    assert len(sizes) == 2 and sizes[1] > sizes[0] > 0
    only = set(args.only.split(","))
    ours_extra = args.ours_args.split()
    # CPU-time caps for our side of the scale figures (a slow launcher can take many minutes at 1000+ points)
    cap_pair, cap_big, cap_growth = (float(x) for x in (args.caps or ("60,60,90" if q else "300,600,1800")).split(","))

    work = Path(tempfile.mkdtemp(prefix="automodel-bench-"))
    load0, t_start = os.getloadavg()[0], time.perf_counter()
    header = (f"# automodel-hydra benchmarks{' --quick' if q else ''}: {os.cpu_count()} CPUs, python "
              f"{platform.python_version()}, load avg {load0:.1f} at start")
    print(header, flush=True)
    progress(f"work dir {work}")
    figures: dict[str, list[Figure]] = {}
    failed: dict[str, str] = {}

    if "compose" in only:
        try:
            figures["compose"] = compose_figures(work)
        except Exception as e:
            failed["compose"] = f"{type(e).__name__}: {e}"
    if "ckpt" in only:
        try:
            figures["ckpt"] = ckpt_figures(work, 4 if q else 8)
        except Exception as e:  # one figure failing must not stop the others
            failed["ckpt"] = f"{type(e).__name__}: {e}"
        progress(f"ckpt done at {time.perf_counter() - t_start:.0f}s")

    tasks: list[PairTask] = []
    by_name: dict[str, PairTask] = {}
    dry_run: Run | None = None
    slurm_missing = not (ROOT / "automodel_hydra" / "backends" / "slurm.py").exists()
    try:
        if "launch" in only:
            t, dry_run = launch_task(work, min_pairs[0], max_pairs[0])
            tasks.append(t)
    except Exception as e:
        failed["launch"] = f"{type(e).__name__}: {e}"
    if "sweep" in only:
        tasks.append(sweep_task(work, min_pairs[1], max_pairs[1], args.sweep_steps))
    if ("plan" in only or "growth" in only) and not slurm_missing:
        tasks.append(plan_task(work, (sizes[0], sizes[1]), min_pairs[2], max_pairs[2]))
    if "submit" in only and not slurm_missing:
        tasks.append(submit_task(work, args.submit_points, min_pairs[3], max_pairs[3], cap_pair, ours_extra))
    if "form" in only and not slurm_missing:
        tasks.append(form_task(work, args.submit_points, min_pairs[3], max_pairs[3], cap_pair, ours_extra))
    by_name = {t.name: t for t in tasks}

    def time_left() -> float:
        """Seconds until the --quick run should be over (its one-off big runs are not started past it)."""
        return deadline - (time.perf_counter() - t_start)

    def one_offs() -> None:
        """The single big runs, after every task's first pair (their skip rules use those pairs)."""
        if "submit" in only and not slurm_missing:
            try:
                sub = by_name.get("submit")
                figures["bigsubmit"] = big_submit_figures(work, args.big_points, cap_big,
                                                          sub if sub and sub.pairs else None, args.submit_points,
                                                          ours_extra, time_left())
            except Exception as e:
                failed["bigsubmit"] = f"{type(e).__name__}: {e}"
        if "growth" in only and not slurm_missing:
            plan = by_name.get("plan")
            if plan is None or not plan.pairs:
                failed["growth"] = "the plan task (its two smaller sizes) did not run"
            else:
                try:
                    figures["growth"] = growth_figures(work, plan, (sizes[0], sizes[1]), 10 * sizes[1], cap_growth,
                                                       time_left())
                except Exception as e:
                    failed["growth"] = f"{type(e).__name__}: {e}"
        progress(f"one-off runs done at {time.perf_counter() - t_start:.0f}s")

    # rounds: every task gets its mandatory pairs; optional ones only while the budget is expected to last
    first_round = True
    while True:
        ran = False
        for t in tasks:
            if t.error or len(t.pairs) >= t.max_pairs:
                continue
            elapsed = time.perf_counter() - t_start
            if len(t.pairs) >= t.min_pairs and elapsed + t.last_s * 1.1 > budget:
                continue
            try:
                t.run_pair()
                ran = True
            except Exception as e:
                t.error = f"{type(e).__name__}: {e}"
                progress(f"{t.name}: FAILED: {t.error}")
        if first_round:
            first_round = False
            one_offs()
        if not ran:
            break

    if "peers" in only:  # last: its cluster jobs use the cores the other figures time
        try:
            figures["peers"] = peer_figures(work, q, args.peer_rounds or (1 if q else 3),
                                            args.peer_points or (20 if q else 200))
        except Unavailable as e:
            figures["peers"] = [Figure(RATIO_OF["peers"], None, note=f"skipped: {e}")]
        except Exception as e:
            failed["peers"] = f"{type(e).__name__}: {e}"
        progress(f"peers done at {time.perf_counter() - t_start:.0f}s")

    for t in tasks:
        if not t.pairs:
            failed[t.name] = t.error or "no pairs ran"
            continue
        if t.name == "launch":
            assert dry_run is not None
            figures["launch"] = launch_figures(t, dry_run)
        elif t.name == "sweep":
            figures["sweep"] = sweep_figures(t)
        elif t.name == "submit":
            figures["submit"] = submit_figures(t, args.submit_points, cap_pair)
        elif t.name == "form":
            figures["form"] = form_figures(t, args.submit_points)
        elif "plan" in only:
            figures["plan"] = plan_figures(t, (sizes[0], sizes[1]))
        if t.error and t.name in figures:  # some pairs ran before one failed: report those, and say so
            figures[t.name][0].note = f"{len(t.pairs)} pairs, then FAILED: {t.error.splitlines()[0]}"
            print(f"# {t.name} failed after {len(t.pairs)} pairs:\n{t.error}", file=sys.stderr)
    if "plan" in only and slurm_missing:
        figures["plan"] = [Figure("array_plan_growth_ratio", None,
                                  note="unavailable: automodel_hydra/backends/slurm.py does not exist yet"),
                           Figure("array_plan_s_per_job", None)]
    for name, err in failed.items():
        if name == "plan" and "plan" not in only:
            continue
        figures[name] = [Figure(RATIO_OF[name], None, note=f"FAILED: {err.splitlines()[0]}")]
        print(f"# {name} failed:\n{err}", file=sys.stderr)

    ordered = [f for k in ORDER for f in figures.get(k, [])]
    total = time.perf_counter() - t_start
    for f in ordered:
        print(figure_line(f))
    if "plan" in only or "growth" in only:
        print(f"array_plan_sizes={sizes[0]}->{sizes[1]}" + (f"->{10 * sizes[1]}" if "growth" in only else ""))
    if ours_extra:
        print(f"# our side of the submit figures ran with: {' '.join(ours_extra)}")
    print(f"# {total:.0f}s in all; load avg {load0:.1f} -> {os.getloadavg()[0]:.1f} (1-min, {os.cpu_count()} CPUs)\n")
    print(table(ordered))
    print()
    print(NOTES)
    missed = [f.name for f in ordered if f.goal is not None and f.status != "ok"]
    verdict = "the measured figures meet their goals"
    if missed:
        verdict = "not within goal or unavailable: " + ", ".join(missed)
    print(f"\n# {verdict}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "quick": q, "total_s": total, "load_avg": [load0, os.getloadavg()[0]], "plan_sizes": sizes,
            "ours_args": ours_extra,
            "figures": {f.name: dataclasses.asdict(f) | {"goal": f.goal, "status": f.status} for f in ordered},
            "pairs": {t.name: [[dataclasses.asdict(r) | {"log": str(r.log), "argv": None} for r in p] for p in t.pairs]
                      for t in tasks},
        }, indent=2, default=str) + "\n")
    if args.keep:
        print(f"# kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if (args.strict and missed) else 0


def figure_line(f: Figure) -> str:
    """``name=value``, then (for a figure with a goal) the goal and whether it is met; ``>=`` marks a lower bound
    (a run cut off at its cap), ``~`` an estimate (a run not made)."""
    line = f"{f.name}={fmt(f.value, 4)}"
    if f.goal is None:
        return line
    kind = {">=": " (a lower bound)", "~": " (an estimate: not run)"}.get(f.bound, "")
    return f"{line:40s} # goal <= {f.goal:g}: {f.status}{kind}"


if __name__ == "__main__":
    sys.exit(main())
