#!/usr/bin/env python
"""Per-job compose cost of a sweep: Hydra's ``load_sweep_config`` against ``_fast._compose.SweepComposer``.

    .venv/bin/python benchmarks/compose_speed.py [--jobs 200] [--hydra-jobs 20]

The project's real config (``conf/``, ``llm_finetune``), the sweep ``seed=range(0,JOBS) optim.lr=1e-4,3e-4
launcher=slurm dry_run=true`` (two learning rates: half the jobs each), expanded by
``BasicSweeper.split_arguments`` exactly as the sweeper hands it to the launcher. Hydra composes the first
``--hydra-jobs`` jobs (its cost per job does not depend on the sweep's size); the composer makes all ``--jobs``.
Times are CPU
seconds of this process (``time.process_time``), which other users' load on a shared machine moves far less than
wall time. Every job's config is checked equal to Hydra's (YAML text) for the jobs Hydra composed. Prints one JSON
object: ``hydra_ms_per_job``, ``ours_ms_per_job``, ``speedup``, ``composes`` (Hydra composes ours needed),
``fallbacks``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hydra import initialize_config_dir  # noqa: E402
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

import automodel_hydra.config  # noqa: E402, F401  (registers the typed schemas)
from hydra_plugins.automodel_hydra_launcher._fast._compose import SweepComposer  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200, help="jobs made by the composer")
    ap.add_argument("--hydra-jobs", type=int, default=20, help="jobs composed by Hydra's load_sweep_config")
    args = ap.parse_args(argv)
    sweep = [f"seed=range(0,{args.jobs // 2})", "optim.lr=1e-4,3e-4", "launcher=slurm", "dry_run=true"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("llm_finetune", [*sweep, "hydra.sweep.dir=/tmp/unused"],
                                           run_mode=RunMode.MULTIRUN)
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(sweep)
        (jobs,) = BasicSweeper.split_arguments(parsed, None)
        loader.load_sweep_config(master, jobs[0])  # warm: file reads and imports are not per-job costs

        t0 = time.process_time()
        theirs = [loader.load_sweep_config(master, j) for j in jobs[:args.hydra_jobs]]
        hydra_s = (time.process_time() - t0) / len(theirs)

        composer = SweepComposer(loader, master)
        t0 = time.process_time()
        ours = [composer.compose(j) for j in jobs]
        ours_s = (time.process_time() - t0) / len(ours)

        same = all(OmegaConf.to_yaml(a) == OmegaConf.to_yaml(b) for a, b in zip(ours, theirs))
    out = {"jobs": len(jobs), "hydra_jobs": len(theirs), "hydra_ms_per_job": hydra_s * 1e3,
           "ours_ms_per_job": ours_s * 1e3, "speedup": hydra_s / ours_s, "composes": composer.composed,
           "fallbacks": composer.fallbacks, "equal_to_hydra": same}
    print(json.dumps(out))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
