#!/usr/bin/env python
"""NeMo-Run's side of benchmarks/run.py's peer figures: submit N tasks to Slurm as a NeMo-Run user would.

    .venv-nemo-run/bin/python benchmarks/nemo_run_sweep.py SPEC.json

SPEC.json: ``{"base_dir": D, "partition": P, "cpus_per_task": C, "commands": [CMD, ...]}``. One
``run.Experiment`` gets one task per command (``run.Script(inline=CMD)``) on a ``run.SlurmExecutor`` with a
``run.LocalTunnel`` (the submitting host is the cluster's login node) and NeMo-Run's defaults otherwise (its
``GitArchivePackager`` packs the git repository of the working directory for each task), and is run with
``exp.run(detach=True)``: it returns once every task is submitted, one ``sbatch`` per task, which is how NeMo-Run
runs an experiment's tasks on Slurm. Runs in NeMo-Run's own environment (benchmarks/setup-nemo-run); the
commands run this project's Python.
"""

from __future__ import annotations

import json
import os
import sys


def main(spec_file: str) -> None:
    with open(spec_file) as f:
        spec = json.load(f)
    import nemo_run as run

    base = spec["base_dir"]
    executor = run.SlurmExecutor(account="", partition=spec["partition"], nodes=1, ntasks_per_node=1,
                                 cpus_per_task=spec["cpus_per_task"], time="00:30:00",
                                 tunnel=run.LocalTunnel(job_dir=os.path.join(base, "experiments")))
    with run.Experiment("bench", executor=executor, base_dir=base, log_level="WARN") as exp:
        for i, command in enumerate(spec["commands"]):
            exp.add(run.Script(inline=command), name=f"task{i}")
        exp.run(detach=True)


if __name__ == "__main__":
    main(sys.argv[1])
