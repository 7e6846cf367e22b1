"""The backend contract as users meet it: a dry run writes exactly what a real run submits."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.helpers import train_py


def _files(run: Path) -> dict[str, bytes]:
    """Every file planning wrote (the records a submission adds are not planning's: its launch id included), with
    ``run`` written ``RUN`` and each dir's tracker id (made once per dir, so two dirs' differ by design; where it
    is read is part of the contract) written ``TRACKER_ID``."""
    ids = [p.read_bytes().strip() for p in run.rglob("launch/tracker_id")]
    out = {}
    for p in sorted(run.rglob("*")):
        if p.is_file() and p.parent.name == "launch" and p.name not in ("submission.json", "manifest.json", "run_id"):
            data = p.read_bytes().replace(str(run).encode(), b"RUN")
            for tracker_id in ids:
                data = data.replace(tracker_id, b"TRACKER_ID")
            out[str(p.relative_to(run))] = data
    return out


@pytest.mark.slow
@pytest.mark.parametrize("sweep", [False, True])
def test_dry_run_and_real_run_write_byte_identical_launch_files(tmp_path: Path, sweep: bool) -> None:
    """Slurm, with a stand-in ``sbatch`` (it records the script it was given and answers a job id, as
    ``sbatch --parsable`` does): no real cluster is needed to compare files."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/sh\nfor a; do f=$a; done\ncp "$f" {tmp_path}/submitted.sh\necho 77\n')
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    where = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    args = [*(["-m", "seed=1,2"] if sweep else []), "launcher=slurm", "slurm.ntasks_per_node=1"]
    train_py(*args, "dry_run=true", f"{where}={tmp_path / 'dry'}", env=env)
    train_py(*args, f"{where}={tmp_path / 'real'}", "slurm.detach=true", env=env)
    dry, real = _files(tmp_path / "dry"), _files(tmp_path / "real")
    assert dry and dry == real
    submitted = (tmp_path / "submitted.sh").read_bytes()
    assert submitted == (tmp_path / "real" / "launch" / "sbatch.sh").read_bytes()  # what ran is what was written
