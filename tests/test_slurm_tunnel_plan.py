"""``slurm.tunnel`` planning, pure (no ssh, no cluster): the schema's one-line refusals, where a run's dirs go on
the login node, the script the ranks run there, and the one line a failed login becomes."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from automodel_hydra import config
from automodel_hydra.backends import slurm
from automodel_hydra.backends.slurm_plan import PROJECT_MOUNT
from automodel_hydra.backends.slurm_transport import Probe
from automodel_hydra.backends.slurm_tunnel import Endpoint, login_error, remote_path
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


def test_run_dirs_keep_their_absolute_path_under_job_dir() -> None:
    there = PurePosixPath("/scratch/jobs/home/me/proj/multirun/S/0")
    assert remote_path(CWD / "multirun/S/0", "/scratch/jobs") == there
    assert remote_path("/tmp/elsewhere/run", "/scratch/jobs") == PurePosixPath("/scratch/jobs/tmp/elsewhere/run")
    assert remote_path("/tmp/a/../b", "/scratch/jobs") == PurePosixPath("/scratch/jobs/tmp/b")


def test_the_script_names_the_login_nodes_paths_and_python() -> None:
    cfg = load("slurm.tunnel.python=/opt/venv/bin/python")
    job = JobSpec(CWD / "outputs" / "run", "train", code_dir=CWD / "outputs" / "run" / "launch" / "code")
    source = Source("git", CWD, CWD, Path("/site-packages"), "abc123" * 7, False, ("train.py",), 10)
    endpoint = Endpoint.of(cfg.slurm.tunnel)
    facts = slurm.Facts(snapshots={("auto", 200.0): source},
                        remote={endpoint: Probe("/usr/bin/sbatch", 1001, "")})
    plan = slurm.Slurm().plan(cfg, job, facts)
    text = plan.files["sbatch.sh"]
    node = "/scratch/me/jobs/home/me/proj/outputs/run"
    assert f"export AUTOMODEL_JOB_DIR={node}\n" in text
    assert f"#SBATCH --output={node}/slurm/%j_0_log.out" in text
    assert f"{node}/launch/code/src" in text and str(CWD) + "/outputs" not in text.replace(node, "")
    assert f"cd {node}/launch/code/src  # slurm.tunnel" in text
    assert "/opt/venv/bin/python -u -m automodel_hydra.worker" in text
    assert plan.request.cluster.endpoint is not None
    assert plan.request.cluster.endpoint.destination == "me@login.example.org"
    assert plan.job.job_dir == job.job_dir, "the local run dir keeps the records"
    assert not slurm.Slurm().ranks_see_local_files(cfg)


def test_without_a_snapshot_the_ranks_use_the_clusters_install() -> None:
    cfg = load("slurm.snapshot=none")
    text = slurm.Slurm().plan(cfg, JobSpec(CWD / "outputs" / "run", "train"), slurm.Facts()).files["sbatch.sh"]
    assert "automodel_hydra is expected to be installed on the cluster" in text
    assert "python -u -m automodel_hydra.worker" in text
    assert "cd /scratch/me/jobs/home/me/proj/outputs/run  # slurm.tunnel" in text


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


def _plan(*overrides: str, home: str | None = "/home/me", job: JobSpec | None = None) -> slurm.Plan[slurm.Request]:
    cfg = load(*overrides)
    endpoint = Endpoint.of(cfg.slurm.tunnel)
    facts = slurm.Facts(remote={endpoint: Probe("/usr/bin/sbatch", 1001, "", home)})
    return slurm.Slurm().plan(cfg, job or JobSpec(CWD / "outputs" / "run", "train"), facts)


def test_the_ranks_spec_is_planned_with_the_login_nodes_paths() -> None:
    """What a dry run writes is what the ranks read there: ``launch/job.tunnel.yaml``, named by the worker command,
    with the run dir's paths turned into the login node's; the local ``launch/job.yaml`` keeps this machine's."""
    import yaml

    plan = _plan("slurm.snapshot=none", f"checkpoint.dir={CWD}/outputs/run/ckpt")
    node = "/scratch/me/jobs/home/me/proj/outputs/run"
    spec = yaml.safe_load(plan.files["job.tunnel.yaml"])
    assert spec["output_dir"] == node and spec["checkpoint"]["dir"] == f"{node}/ckpt"
    assert str(CWD / "outputs") not in plan.files["job.tunnel.yaml"].split("\n", 1)[1].replace(node, "")
    assert '-m automodel_hydra.worker "$AUTOMODEL_JOB_DIR"/launch/job.tunnel.yaml' in plan.files["sbatch.sh"]
    local = slurm.Slurm().plan(config.load(compose_cfg(["launcher=slurm", "slurm.snapshot=none"], CWD / "o")),
                               JobSpec(CWD / "o", "train"))
    assert list(local.files) == ["sbatch.sh"] and "launch/job.yaml" in local.files["sbatch.sh"]


def test_a_tilde_in_job_dir_and_python_is_the_login_nodes_home() -> None:
    plan = _plan("slurm.tunnel.job_dir='~/jobs'", "slurm.tunnel.python='~/venv/bin/python'", "slurm.snapshot=none")
    text = plan.files["sbatch.sh"]
    assert "export AUTOMODEL_JOB_DIR=/home/me/jobs/home/me/proj/outputs/run\n" in text
    assert "/home/me/venv/bin/python -u -m automodel_hydra.worker" in text and "~" not in text
    with pytest.raises(ConfigError, match=r"^slurm.tunnel.job_dir='~/jobs' is invalid: .*login node's home"):
        _plan("slurm.tunnel.job_dir='~/jobs'", home=None)


@pytest.mark.parametrize(("override", "key"), [("slurm.tunnel.job_dir='~bob/jobs'", "slurm.tunnel.job_dir"),
                                               ("slurm.tunnel.python='~bob/python'", "slurm.tunnel.python"),
                                               ("slurm.tunnel.reconnect_timeout_s=-1",
                                                "slurm.tunnel.reconnect_timeout_s")])
def test_another_users_home_or_a_negative_wait_is_one_line_without_a_local_path(override: str, key: str) -> None:
    import os

    with pytest.raises(ConfigError) as e:
        load(override)
    assert str(e.value).startswith(f"{key}=") and "\n" not in str(e.value)
    assert os.path.expanduser("~") not in str(e.value)


@pytest.mark.parametrize("key", ["+slurm.tunnel.job_dir", "slurm.tunnel.python", "slurm.hf_home"])
def test_an_unquoted_tilde_of_another_machine_is_never_written_out_as_this_ones(key: str) -> None:
    """Hydra's grammar refuses an unquoted ``~`` in a value; for a field whose ``~`` is the login node's (or the
    nodes') home, the line says to quote it and never suggests this machine's home."""
    import os

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    from automodel_hydra import errors

    with pytest.raises(OverrideParseException) as e:
        OverridesParser.create().parse_overrides([f"{key}=~/x"])
    line = errors.describe(e.value)
    assert line is not None and f"""'{key}="~/x"'""" in line and os.path.expanduser("~") not in line
    assert "home" in line


def test_a_container_through_the_tunnel_never_mounts_this_machines_checkout() -> None:
    """Without a snapshot the image must have the project (this machine's checkout is not on the cluster);
    ``nemo_mount`` as a container path, which mounts that checkout, is refused in one line."""
    plan = _plan("slurm.container_image=nvcr.io/nvidia/nemo:25.02", "slurm.snapshot=none")
    text = plan.files["sbatch.sh"]
    assert str(JobSpec.project_root) not in text and PROJECT_MOUNT not in text
    assert "expected to be installed in the image" in text and "export PYTHONPATH=''" not in text
    with pytest.raises(ConfigError, match=r"^slurm.nemo_mount='/opt/x' is invalid: .*slurm.tunnel"):
        _plan("slurm.container_image=nvcr.io/nvidia/nemo:25.02", "slurm.nemo_mount=/opt/x")


def test_a_marked_command_is_read_between_its_markers_whatever_the_shell_printed() -> None:
    """The SSH transport's protocol: a login shell's greeting before, ssh's or a logout script's words after, and
    output without a final newline or with bytes that look like lines are all read back as the command wrote
    them."""
    from automodel_hydra.backends.slurm_tunnel import _between

    token = "amh-0123456789abcdef"
    body = b"line\x00\xff\nno newline at the end"
    data = b"Welcome to login1\n" + token.encode() + b"\n" + body + b"\n" + token.encode() + b".end 3\nlogout\n"
    assert _between(data, token, with_status=True) == (body, 3)
    assert _between(b"Welcome\n" + token.encode() + b"\npartial", token, with_status=True) == (None, None)


@pytest.mark.slow  # real ssh processes, against a port nothing listens on
def test_reconnecting_backs_off_and_gives_up_within_its_budget() -> None:
    from automodel_hydra.backends.slurm_tunnel import TunnelError, reconnect, said
    from tests.helpers import free_port

    slept: list[float] = []
    endpoint = Endpoint("127.0.0.1", None, free_port(), None, (("StrictHostKeyChecking", "no"),))
    lost = reconnect([endpoint], 10.0, sleep=slept.append, clock=lambda: sum(slept))
    assert isinstance(lost, TunnelError) and "Connection refused" in said(lost)
    assert slept == [1.0, 2.0, 4.0]  # the next wait (8 s) would pass the 10 s budget: it gives up instead


@pytest.mark.parametrize("written", ["$HOME", "${HOME}"])
def test_home_in_a_login_node_field_is_the_login_nodes_home_not_this_shells(written: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``$HOME`` / ``${HOME}`` in ``slurm.tunnel.job_dir`` and ``slurm.tunnel.python`` is read as ``~`` is there:
    the login node's home (its preflight answer), never this shell's ``$HOME``; ``HOME`` elsewhere in such a
    field is one line that names no local path."""
    monkeypatch.setenv("HOME", "/local/home/of/this/machine")
    plan = _plan(f"slurm.tunnel.job_dir='{written}/jobs'", f"slurm.tunnel.python='{written}/venv/bin/python'",
                 f"+slurm.hf_home='{written}/hf'", "slurm.snapshot=none")
    text = plan.files["sbatch.sh"]
    assert "export AUTOMODEL_JOB_DIR=/home/me/jobs/" in text, text
    assert "/home/me/venv/bin/python -u -m automodel_hydra.worker" in text
    assert 'HF_HOME="$HOME"/hf' in text, [line for line in text.splitlines() if "HF_HOME" in line]
    assert "/local/home" not in text
    with pytest.raises(ConfigError) as e:
        load(f"slurm.tunnel.job_dir='/scratch{written}/jobs'")
    assert str(e.value).startswith("slurm.tunnel.job_dir=") and "/local/home" not in str(e.value)
    assert "login node" in str(e.value) and "\n" not in str(e.value)


def test_a_run_dirs_place_on_the_login_node_does_not_depend_on_the_submitting_dir(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same local run dir, planned from three submitting dirs (its parent, a sibling, /): one dir there."""
    cfg = load("slurm.snapshot=none")
    endpoint = Endpoint.of(cfg.slurm.tunnel)
    seen = set()
    for cwd in ("/tmp", "/usr", "/"):
        monkeypatch.chdir(cwd)
        facts = slurm.Facts(remote={endpoint: Probe("/usr/bin/sbatch", 1001, "", "/home/me")})
        text = slurm.Slurm().plan(cfg, JobSpec(Path("/tmp/tr/t5"), "train"), facts).files["sbatch.sh"]
        seen.add(next(line for line in text.splitlines() if line.startswith("export AUTOMODEL_JOB_DIR=")))
    assert seen == {"export AUTOMODEL_JOB_DIR=/scratch/me/jobs/tmp/tr/t5"}, seen


def test_a_stop_line_names_the_login_nodes_checkpoints_never_none_here() -> None:
    """A tunnel job stopped while its launcher waits: its ranks checkpoint on the login node, so the stop line
    names that dir there (``user@host:PATH``), not "no checkpoint yet in" this machine's dir."""
    from automodel_hydra import driver
    from automodel_hydra.plan import JobResult, JobStoppedError, Submission
    from automodel_hydra.states import JobState

    plan = _plan("slurm.snapshot=none")
    cfg = load("slurm.snapshot=none")
    stopped = driver.Outcome(driver.Prepared(cfg, plan.job, False), Submission(plan, slurm.SlurmRef("42")),
                             JobResult(JobState.CANCELLED))
    with pytest.raises(JobStoppedError) as e:
        stopped.value()
    line = str(e.value)
    assert "me@login.example.org:/scratch/me/jobs/home/me/proj/outputs/run/checkpoints" in line, line
    assert "no checkpoint yet" not in line and "\n" not in line


def test_a_failed_slurm_jobs_line_names_its_log_once(tmp_path: Path) -> None:
    """The command's line for a failed Slurm job names the job and its log once (the result's own error said
    them again: "(log X) (log: X)")."""
    from automodel_hydra import driver
    from automodel_hydra.plan import JobFailedError, Submission
    from automodel_hydra.states import JobState

    cfg = load("slurm.snapshot=none", output_dir=tmp_path / "run")
    job = JobSpec(tmp_path / "run", "train")
    plan = slurm.Slurm().plan(cfg, job, slurm.Facts(remote={Endpoint.of(cfg.slurm.tunnel): Probe(
        "/usr/bin/sbatch", 1001, "", "/home/me")}))
    log = f"me@login.example.org:/scratch/me/jobs{tmp_path}/run/slurm/42_0_log.out"
    sub = Submission(plan, slurm.SlurmRef("42"), log_path=log)
    failed = driver.Outcome(driver.Prepared(cfg, job, False), sub, slurm._result(sub, JobState.FAILED))
    with pytest.raises(JobFailedError) as e:
        failed.value()
    line = str(e.value)
    assert line.count(log) == 1 and line.count("job 42") == 1, line


@pytest.mark.parametrize("shell", ["bash", "dash", "tcsh"])
def test_a_remote_command_line_means_the_same_script_in_every_login_shell(shell: str) -> None:
    """What sshd hands the login shell (``$SHELL -c LINE``) runs the script as sh would, quotes, ``!``, ``%``,
    backslashes and newlines included (tcsh: "Unmatched '''" for a multi-line single-quoted script)."""
    import os
    import shutil
    import subprocess

    from automodel_hydra.backends.slurm_tunnel import sh

    if shutil.which(shell) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{shell} is missing (scripts/install-slurm-deps installs tcsh)")
        pytest.skip(f"no {shell} here (scripts/install-slurm-deps installs tcsh)")
    script = ("printf '%s|\\n' \"a  b\" 'it''s' \"100%\" '!x' 'c:\\\\d'\n"
              "for p in /jobs/* ; do :; done; echo \"$((6*7))\"")
    want = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    got = subprocess.run([shell, "-c", sh(script)], capture_output=True, text=True)
    assert (got.returncode, got.stdout, got.stderr) == (0, want, ""), got
    assert "\n" not in sh(script) and "!" not in sh(script)
