"""``slurm.tunnel`` planning, pure (no ssh, no cluster): the schema's one-line refusals, where a run's dirs go on
the login node, the script the ranks run there, and the one line a failed login becomes."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from automodel_hydra import config
from automodel_hydra.backends import slurm
from automodel_hydra.backends.slurm_tunnel import Endpoint, Probe, login_error, remote_path
from automodel_hydra.plan import JobSpec
from automodel_hydra.schema import ConfigError
from automodel_hydra.snapshot import Source
from tests.helpers import compose_cfg

TUNNEL = ["slurm.tunnel.host=login.example.org", "slurm.tunnel.user=me", "slurm.tunnel.job_dir=/scratch/me/jobs"]
CWD = Path("/home/me/proj")


def load(*overrides: str, output_dir: Path = CWD / "outputs" / "run") -> config.TrainConfig:
    return config.load(compose_cfg(["launcher=slurm", *TUNNEL, *overrides], output_dir))


@pytest.mark.parametrize(("override", "key"), [
    ("slurm.tunnel.job_dir=jobs", "slurm.tunnel.job_dir"),
    ("slurm.tunnel.host='-oProxyCommand=x'", "slurm.tunnel.host"),
    ("slurm.tunnel.host='two words'", "slurm.tunnel.host"),
    ("slurm.tunnel.port=70000", "slurm.tunnel.port"),
    ("slurm.tunnel.user='a b'", "slurm.tunnel.user"),
    ("+slurm.tunnel.options.not-an-option=1", "slurm.tunnel.options.not-an-option"),
])
def test_a_bad_tunnel_field_is_one_line_naming_it(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(override)
    assert str(e.value).startswith(f"{key}=") and "\n" not in str(e.value)


def test_run_dirs_keep_their_path_under_job_dir() -> None:
    assert remote_path(CWD / "multirun/S/0", CWD, "/scratch/jobs") == PurePosixPath("/scratch/jobs/multirun/S/0")
    assert remote_path("/tmp/elsewhere/run", CWD, "/scratch/jobs") == PurePosixPath("/scratch/jobs/tmp/elsewhere/run")
    assert remote_path(CWD, CWD, "/scratch/jobs") == PurePosixPath("/scratch/jobs")


def test_the_script_names_the_login_nodes_paths_and_python() -> None:
    cfg = load("slurm.tunnel.python=/opt/venv/bin/python")
    job = JobSpec(CWD / "outputs" / "run", "train", code_dir=CWD / "outputs" / "run" / "launch" / "code")
    source = Source("git", CWD, CWD, Path("/site-packages"), "abc123" * 7, False, ("train.py",), 10)
    endpoint = Endpoint.of(cfg.slurm.tunnel)
    facts = slurm.Facts(snapshots={("auto", 200.0): source}, cwd=CWD,
                        remote={endpoint: Probe("/usr/bin/sbatch", 1001, "")})
    plan = slurm.Slurm().plan(cfg, job, facts)
    text = plan.files["sbatch.sh"]
    node = "/scratch/me/jobs/outputs/run"
    assert f"export AUTOMODEL_JOB_DIR={node}\n" in text
    assert f"#SBATCH --output={node}/slurm/%j_0_log.out" in text
    assert f"{node}/launch/code/src" in text and str(CWD) + "/outputs" not in text.replace("AUTOMODEL_CODE_ROOT", "")
    assert f"cd {node}/launch/code/src  # slurm.tunnel" in text
    assert "/opt/venv/bin/python -u -m automodel_hydra.worker" in text
    assert plan.request.remote is not None and plan.request.remote.endpoint.destination == "me@login.example.org"
    assert plan.job.job_dir == job.job_dir, "the local run dir keeps the records"
    assert not slurm.Slurm().ranks_see_local_files(cfg)


def test_without_a_snapshot_the_ranks_use_the_clusters_install() -> None:
    cfg = load("slurm.snapshot=none")
    text = slurm.Slurm().plan(cfg, JobSpec(CWD / "outputs" / "run", "train"), slurm.Facts(cwd=CWD)).files["sbatch.sh"]
    assert "automodel_hydra is expected to be installed on the cluster" in text
    assert "python -u -m automodel_hydra.worker" in text and "cd /scratch/me/jobs/outputs/run  # slurm.tunnel" in text


@pytest.mark.parametrize(("stderr", "field", "words"), [
    ("ssh: connect to host h port 22: Connection refused", "slurm.tunnel.host", "does not answer"),
    ("ssh: connect to host h port 22: Connection timed out", "slurm.tunnel.host", "does not answer"),
    ("ssh: Could not resolve hostname h: Name or service not known", "slurm.tunnel.host", "does not answer"),
    ("me@h: Permission denied (publickey).", "slurm.tunnel.identity", "refused the key /k"),
    ("Host key verification failed.", "slurm.tunnel.host", "host key"),
])
def test_a_failed_login_names_which(stderr: str, field: str, words: str) -> None:
    line = login_error(Endpoint("h", "me", None, "/k"), stderr, 255)
    assert line.startswith(field) and words in line and "\n" not in line
