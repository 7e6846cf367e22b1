"""A file with an AutoModel-shaped ``slurm:`` section (AutoModel's key names, no ``gpus_per_node``) on the project's
real Slurm test cluster, which has no GPUs: it is submitted without a GPU request and runs to the end; a GPU
request the cluster cannot meet is refused in one line naming the key, before sbatch. One short job (2 steps,
2 ranks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

#: AutoModel's documented slurm block, as a user copies it (job_name, nodes, ntasks_per_node, time, partition)
AUTOMODEL_SHAPED = """\
step_scheduler:
  max_steps: 2
  checkpoint_interval: 2
  log_interval: 1
slurm:
  job_name: am_shaped
  nodes: 1
  ntasks_per_node: 2
  time: 00:10:00
  partition: debug
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "automodel_hydra.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)


def test_an_automodel_shaped_slurm_file_without_gpus_per_node_runs_on_a_cluster_without_gpus(
        slurm_cluster, tmp_path: Path) -> None:
    cfg = tmp_path / "am_slurm.yaml"
    cfg.write_text(AUTOMODEL_SHAPED)
    run = tmp_path / "R"
    proc = _cli(str(cfg), "--slurm.wait=true", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    script = (run / "launch" / "sbatch.sh").read_text()
    assert "gpus-per-node" not in script and "gres" not in script
    record = json.loads((run / "launch" / "submission.json").read_text())
    assert slurm_cluster.sacct_state(record["job_ids"][0], timeout=30) == "COMPLETED"
    assert json.loads((run / "result.json").read_text())["world_size"] == 2

    # refused by the preflight from the partition's nodes (no GPUs in their Gres), before anything is submitted
    refused = _cli(str(cfg), "--slurm.gpus_per_node=1", f"hydra.run.dir={tmp_path / 'G'}", cwd=tmp_path)
    assert refused.returncode == 2
    last = refused.stdout.strip().splitlines()[-1]
    assert last.startswith("error: ") and "slurm.gpus_per_node=1" in last, refused.stdout[-2000:]
    assert not (tmp_path / "G" / "launch" / "submission.json").exists()
