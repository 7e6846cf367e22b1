"""How long ``automodel-hydra resume S`` takes to decide and submit, for a 1000-point Slurm sweep with 10 failed
members, and whether that depends on how big the finished members' dirs are.

    .venv/bin/python benchmarks/resume_sweep.py [--points 1000] [--failed 10] [--big-mb 256] [--rounds 2]

No cluster: ``sbatch`` is the recording stand-in of the sweep benchmarks (``benchmarks/standins/sbatch``: the time
of each call and the caller's CPU seconds), and ``sacct``/``squeue`` are stand-ins written here that answer for
the array's tasks from a table (COMPLETED, or FAILED for the failed members). The sweep is submitted once for
real through that ``sbatch`` (``train.py -m seed=range(0,N) launcher=slurm slurm.detach=true``); each finished
member then gets the ``result.json`` its rank 0 writes (this launch's ``run_id``), and the failed ones none. Then,
in rounds that alternate the order:

* ``small``: the finished members' dirs as the launch left them;
* ``big``: each finished member with a ``metrics.jsonl``, a ``train.log`` and a checkpoint file of ``--big-mb`` MB
  each (sparse files: no disk is used, but reading them would cost their size).

Each round times ``automodel-hydra resume S`` from command start to the stand-in's ``sbatch`` call (the resume
submits one array of the failed members' task ids; ``slurm.detach=true`` returns after it), and checks that the
array is exactly those ids. Prints ``name=value`` lines:

* ``sweep_resume_1000_s``: the median time to that ``sbatch`` call, ``small`` (goal: under 3 s);
* ``sweep_resume_size_ratio``: ``big`` / ``small`` (1 = the finished members' sizes do not matter).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STANDINS = ROOT / "benchmarks" / "standins"
PY = sys.executable

SACCT = """#!/bin/sh
# stand-in for sacct(1), benchmarks only: the array's tasks as sacct -X --parsable2 --noheader prints them
cat "$SACCT_STANDIN_TABLE"
"""
SQUEUE = "#!/bin/sh\n# stand-in for squeue(1), benchmarks only: no job is queued\nexit 0\n"


def env(work: Path, record: Path) -> dict[str, str]:
    return dict(os.environ, PATH=f"{work / 'bin'}{os.pathsep}{STANDINS}{os.pathsep}{os.environ.get('PATH', '')}",
                SBATCH_STANDIN_RECORD=str(record), SACCT_STANDIN_TABLE=str(work / "sacct.txt"),
                PYTHONPATH=str(ROOT))


def submit(work: Path, sweep: Path, points: int) -> None:
    """The sweep, submitted through the stand-in: one array of ``points`` tasks."""
    record = work / "first.calls"
    proc = subprocess.run([PY, "train.py", "-m", f"seed=range(0,{points})", "launcher=slurm", "slurm.detach=true",
                           "slurm.partition=debug", "slurm.gpus_per_node=0", "step_scheduler.max_steps=10",
                           f"hydra.sweep.dir={sweep}"], cwd=ROOT, env=env(work, record), capture_output=True,
                          text=True, timeout=1800, check=False)
    if proc.returncode != 0 or not record.exists():
        raise SystemExit(f"the {points}-point sweep was not submitted:\n{proc.stderr[-3000:]}")


def finish(sweep: Path, failed: set[int]) -> str:
    """Each member's end as its ranks and sacct would leave it; the sacct table's text."""
    from automodel_hydra import records as run_records

    rows = []
    for r in run_records.manifest_jobs(sweep):  # (paths stored relative to the sweep dir: read as paths here)
        num, job_dir = int(r["job_num"]), Path(r["job_dir"])
        if num not in failed:
            run_id = (job_dir / "launch" / "run_id").read_text().strip()
            (job_dir / "result.json").write_text(json.dumps({"loss": 1.0 / (num + 1), "step": 10, "run_id": run_id}))
        rows.append(f"{r['job_ids'][0]}|{'FAILED' if num in failed else 'COMPLETED'}|None")
    return "\n".join(rows) + "\n"


def grow(sweep: Path, failed: set[int], mb: int, big: bool) -> None:
    """Give every finished member big files (sparse), or take them away."""
    for d in sweep.iterdir():
        if not d.name.isdigit() or int(d.name) in failed:
            continue
        for rel in ("metrics.jsonl", "train.log", "checkpoints/step-10/__0_0.distcp"):
            path = d / rel
            if big:
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "ab") as f:
                    f.truncate(mb << 20)
            else:
                path.unlink(missing_ok=True)


def resume_once(work: Path, sweep: Path, failed: set[int], tag: str) -> tuple[float, float]:
    """``automodel-hydra resume S``: seconds and caller CPU seconds to the sbatch call; checks its array."""
    record = work / f"{tag}.calls"
    record.unlink(missing_ok=True)
    for n in failed:  # what the previous round's resume left: each failed member FAILED again, as in the table
        (sweep / str(n) / "result.json").unlink(missing_ok=True)
    start = time.time()
    proc = subprocess.run([PY, "-m", "automodel_hydra.cli", "resume", str(sweep)], cwd=work, env=env(work, record),
                          capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0 or not record.exists():
        raise SystemExit(f"resume ({tag}) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    calls = record.read_text().splitlines()
    epoch, cpu = calls[0].split()[:2]
    script = Path(calls[0].split()[-1]).read_text()
    spec = re.search(r"^#SBATCH --array=(\S+)$", script, re.M)
    want = ",".join(str(n) for n in sorted(failed))
    if len(calls) != 1 or spec is None or spec.group(1).split("%")[0] != want:
        raise SystemExit(f"resume ({tag}) submitted {len(calls)} array(s), --array={spec and spec.group(1)}: "
                         f"expected one, of {want}")
    first = proc.stdout.splitlines()[0]
    if not first.startswith(f"resume: {len(list(sweep.glob('*/result.json')))} of "):
        raise SystemExit(f"resume ({tag}) said: {first}")
    return float(epoch) - start, float(cpu) if cpu != "-" else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=1000)
    ap.add_argument("--failed", type=int, default=10)
    ap.add_argument("--big-mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="resume-bench-"))
    try:
        (work / "bin").mkdir()
        for name, text in (("sacct", SACCT), ("squeue", SQUEUE)):
            (work / "bin" / name).write_text(text)
            (work / "bin" / name).chmod(0o755)
        sweep = work / "S"
        t0 = time.time()
        submit(work, sweep, args.points)
        print(f"# {args.points}-point sweep submitted in {time.time() - t0:.1f} s", file=sys.stderr)
        step = max(1, args.points // args.failed)
        failed = set(range(step // 2, args.points, step)[:args.failed])
        (work / "sacct.txt").write_text(finish(sweep, failed))
        times: dict[str, list[tuple[float, float]]] = {"small": [], "big": []}
        for i in range(args.rounds):
            for tag in (("small", "big") if i % 2 == 0 else ("big", "small")):
                grow(sweep, failed, args.big_mb, tag == "big")
                times[tag].append(resume_once(work, sweep, failed, f"{tag}-{i}"))
                print(f"# {tag}: {times[tag][-1][0]:.2f} s ({times[tag][-1][1]:.2f} cpu-s)", file=sys.stderr)
        small = statistics.median(t for t, _ in times["small"])
        big = statistics.median(t for t, _ in times["big"])
        load = os.getloadavg()[0]
        print(f"sweep_resume_{args.points}_s={small:.2f}   # start -> sbatch of the {args.failed} failed members' "
              f"array; {statistics.median(c for _, c in times['small']):.2f} cpu-s; load {load:.1f}")
        print(f"sweep_resume_size_ratio={big / small:.3f}   # finished members with 3 x {args.big_mb} MB files "
              f"{big:.2f} s / as launched {small:.2f} s")
        if args.json:
            args.json.write_text(json.dumps({"small": times["small"], "big": times["big"]}, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
