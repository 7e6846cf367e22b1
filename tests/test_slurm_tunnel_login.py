"""``slurm.tunnel`` against a login node as it is: a login shell that prints, a home that is not this machine's, a
connection that drops while a job is followed, a container job. A real sshd on loopback (tests/ssh_server.py) in
front of the real test cluster, and a launching shell without SLURM_CONF or a Slurm client (tests/test_slurm_tunnel).

The login user of the first tests is a second user that the fixture makes (the tests run as root; without root
they skip): its home is ``/home/<user>``, not this machine's ``$HOME``, and its ``~/.bashrc`` greets on stdout and
on stderr before every command, as MOTD scripts and ``module load`` messages do; its ``sbatch`` is a site wrapper
that prints a banner before the job id (the job is queued all the same). Its ranks' python, ``~/venv/bin/python``,
is a plain interpreter with this venv's site-packages on its path: ``automodel_hydra`` comes from the snapshot."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import sysconfig
import time
import typing as tp
from pathlib import Path

import pytest

from tests import ssh_server
from tests.helpers import ROOT, git
from tests.test_slurm_tunnel import cli, launch, local_env

pytestmark = [pytest.mark.slurm]

#: What the login user's shell prints before every command (stdout, then stderr), as a site's MOTD and modules do.
GREETING = "Welcome to login1 (automodel-hydra test cluster): 2 nodes, partition debug"
MODULES = "module: loaded slurm/22.05 (default)"
#: A site's sbatch wrapper: a banner on stdout before sbatch's own output.
BANNER = "sbatch wrapper: jobs of this project are charged to account 'test'"
#: The login user's ``sbatch``: a site's wrapper that prints a banner first; when ``~/drop-connection`` exists it
#: removes it and, once sbatch queued the job, kills its own ssh session (the first ``sshd`` among its ancestors,
#: the user's own process), as a connection that drops while sbatch runs.
SBATCH_WRAPPER = """#!/bin/sh
echo "{banner}"
/usr/bin/sbatch "$@"
status=$?
if [ -e "$HOME/drop-connection" ]; then
    rm -f "$HOME/drop-connection"
    pid=$$
    while [ "$pid" -gt 1 ]; do
        pid=$(cut -d' ' -f4 /proc/$pid/stat)
        if [ "$(cat /proc/$pid/comm)" = sshd ]; then kill -9 "$pid"; break; fi
    done
fi
exit $status
"""
#: The venv's site-packages (torch, omegaconf, yaml): what the login user's python and the "image" see.
SITE = sysconfig.get_paths()["purelib"]


@dataclasses.dataclass
class Login:
    """The second login user and the sshd that lets it in."""

    name: str
    home: Path
    server: ssh_server.SSHServer

    @property
    def python(self) -> Path:
        return self.home / "venv" / "bin" / "python"

    def overrides(self, **fields: str) -> list[str]:
        """``+slurm.tunnel.*`` overrides for this user on this server; ``fields`` replace the defaults as they
        are written (quote a value yourself: ``job_dir='"~/jobs"'``)."""
        values = {**ssh_server_tunnel(self.server, self.home / "jobs", self.python, self.name), **fields}
        return [f"+slurm.tunnel.{k}={v}" for k, v in values.items()]


def ssh_server_tunnel(server: ssh_server.SSHServer, job_dir: Path, python: Path, user: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in server.tunnel(job_dir, python=str(python), user=user).items():
        if isinstance(value, dict):
            out.update({f"options.{k}": str(v) for k, v in value.items()})
        else:
            out[key] = str(value)
    return out


def _interpreter() -> str | None:
    """A python of this venv's version that another user can run (this one may live under root's home)."""
    want = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = shutil.which(want, path="/usr/local/bin:/usr/bin:/bin")
    return found if found and os.access(found, os.X_OK) and not found.startswith("/root") else None


@contextlib.contextmanager
def _login_user(factory: pytest.TempPathFactory, prefix: str, shell: str, python: str,
                files: tp.Mapping[str, str]) -> tp.Iterator[Login]:
    """A second user (useradd; its name ``prefix`` + 6 hex) whose login shell is ``shell``, with ``files`` in its
    home (relative path -> text; what is under a ``bin/`` is executable) and ``~/venv/bin/python``, ``python``
    importing this venv's packages, allowed on a sshd of its own; the sshd stopped and the user removed after."""
    name = f"{prefix}{secrets.token_hex(3)}"
    # '*': no password, yet not a locked account (sshd refuses a locked one, '!', even for a key)
    subprocess.run(["useradd", "-m", "-d", f"/home/{name}", "-s", shell, "-p", "*", name], check=True)
    try:
        home = Path(pwd.getpwnam(name).pw_dir)
        venv_python = f'#!/bin/sh\nexport PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{SITE}"\nexec {python} "$@"\n'
        for rel, text in {**files, "venv/bin/python": venv_python}.items():
            path = home / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if path.parent.name == "bin":
                path.chmod(0o755)
        subprocess.run(["chown", "-R", f"{name}:", str(home)], check=True)
        server, proc = ssh_server.start(factory.mktemp(f"sshd-{prefix}"), users=[name])
        try:
            yield Login(name, home, server)
        finally:
            ssh_server.stop(proc)
    finally:
        subprocess.run(["userdel", "--force", "--remove", name], check=False, capture_output=True)


@pytest.fixture(scope="module")
def login(tmp_path_factory: pytest.TempPathFactory) -> tp.Iterator[Login]:
    """A second user whose login shell prints, its home in /home, allowed on a sshd of its own."""
    if os.geteuid() != 0:
        pytest.skip("a second login user is made with useradd, which needs root")
    python = _interpreter()
    if shutil.which("useradd") is None or python is None:
        pytest.skip(f"needs useradd and a python{sys.version_info.major}.{sys.version_info.minor} outside /root")
    with _login_user(tmp_path_factory, "amh", "/bin/bash", python, {
            ".bashrc": f'echo "{GREETING}"\necho "{MODULES}" >&2\nexport PATH="$HOME/bin:$PATH"\n',
            "bin/sbatch": SBATCH_WRAPPER.format(banner=BANNER)}) as user:
        yield user


RECIPE = '''
import time

VERSION = "{version}"


def main(cfg, dist, should_stop):
    print(f"recipe {{VERSION}} started on rank {{dist.rank}}", flush=True)
    time.sleep(cfg.x)
    print(f"recipe {{VERSION}} on rank {{dist.rank}} of {{dist.world_size}}", flush=True)
    return {{"loss": 0.0, "version": VERSION, "x": cfg.x, "world_size": dist.world_size}}
'''


def repo_of(tmp_path: Path) -> Path:
    from tests import helpers

    return helpers.user_repo(tmp_path, RECIPE, helpers.USER_JOB)


# ----------------------------------------------------------------------------------------------- a shell that prints


def test_a_login_shell_that_prints_reaches_none_of_what_is_read(slurm_cluster, login: Login, tmp_path: Path) -> None:
    """Greetings on stdout and stderr before every command, and an sbatch wrapper's banner before the job id: the
    job is submitted and recorded, its log followed, its result copied back, its state read, as on a quiet node."""
    repo, run = repo_of(tmp_path), tmp_path / "run"
    env = local_env(tmp_path)
    proc = launch(repo, env, *login.overrides(), "slurm.nodes=2", "+slurm.wait=true", f"hydra.run.dir={run}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    record = json.loads((run / "launch" / "submission.json").read_text())  # recorded although sbatch said more
    (job_id,) = record["job_ids"]
    assert job_id.isdigit() and f"submitted slurm job {job_id}" in proc.stdout
    assert "recipe submitted on rank 0 of 2" in proc.stdout, "the log is followed through the talking shell"
    there = login.home / "jobs" / run.relative_to("/")
    assert json.loads((run / "result.json").read_text()) == json.loads((there / "result.json").read_text())
    log = f"slurm/{job_id}_0_log.out"
    assert (run / log).read_bytes() == (there / log).read_bytes(), "the copy-back's tar stream is the command's own"
    assert GREETING not in (run / "result.json").read_text() and MODULES not in proc.stdout
    assert GREETING not in proc.stdout, [line for line in proc.stdout.splitlines() if GREETING in line]
    assert f"squeue lists job {job_id} for the script" in out  # the wrapper's banner hid the id from --parsable
    status = cli(env, "status", str(run), "--json")
    assert [r["state"] for r in json.loads(status.stdout)] == ["COMPLETED"], status.stderr
    logs = cli(env, "logs", str(run), "--no-follow")
    assert "recipe submitted on rank 0 of 2" in logs.stdout and GREETING not in logs.stdout, logs.stderr


def test_a_connection_lost_while_sbatch_runs_keeps_the_queued_job(slurm_cluster, login: Login, tmp_path: Path) -> None:
    """The ssh session dies right after sbatch queued the job, before its answer came back: once the login node
    answers again the job is found by its script and recorded, and followed to its end."""
    repo, run = repo_of(tmp_path), tmp_path / "run"
    flag = login.home / "drop-connection"
    flag.write_text("")
    os.chown(flag, pwd.getpwnam(login.name).pw_uid, -1)
    proc = launch(repo, local_env(tmp_path), *login.overrides(), "+slurm.wait=true", f"hydra.run.dir={run}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert not flag.exists(), "the wrapper dropped the connection"
    (job_id,) = json.loads((run / "launch" / "submission.json").read_text())["job_ids"]
    assert json.loads((run / "result.json").read_text())["version"] == "submitted" and job_id.isdigit()
    assert len([line for line in out.splitlines() if f"submitted slurm job {job_id}" in line]) == 1
    assert "was lost while sbatch" in out and f"squeue lists job {job_id} for the script" in out


# ----------------------------------------------------------------------------------------------- ~ on the login node


def test_a_tilde_in_a_login_node_field_is_the_login_nodes_home(slurm_cluster, login: Login, tmp_path: Path) -> None:
    """``~/jobs`` and ``~/venv/bin/python`` are the login user's (``/home/<user>``), read once at preflight; the
    unquoted form, which Hydra's grammar refuses, gets a line that never names this machine's home."""
    repo, run = repo_of(tmp_path), tmp_path / "run"
    env = local_env(tmp_path)
    bare = launch(repo, env, *login.overrides(job_dir="~/jobs"), f"hydra.run.dir={run}")
    line = bare.stderr.strip().splitlines()[-1]
    assert bare.returncode == 2 and line.startswith("error: +slurm.tunnel.job_dir=~/jobs"), bare.stderr[-2000:]
    assert str(Path.home()) not in line and "login node" in line and """'+slurm.tunnel.job_dir="~/jobs"'""" in line
    assert not run.exists() or not (run / "launch" / "submission.json").exists()
    proc = launch(repo, env, *login.overrides(job_dir='"~/jobs"', python='"~/venv/bin/python"'), "+slurm.wait=true",
                  f"hydra.run.dir={run}")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    there = login.home / "jobs" / run.relative_to("/")
    assert json.loads((there / "result.json").read_text())["version"] == "submitted"
    script = (run / "launch" / "sbatch.sh").read_text()
    assert f"export AUTOMODEL_JOB_DIR={there}\n" in script and f"{login.python} -u -m automodel_hydra.worker" in script
    assert "~/" not in script and str(Path.home()) not in script


# ----------------------------------------------------------------------------------------------- a dropped connection


@pytest.fixture
def own_sshd(tmp_path: Path) -> tp.Iterator[dict[str, tp.Any]]:
    """A sshd of the test's own, which the test takes down and brings up again on the same ports."""
    (tmp_path / "sshd").mkdir()
    server, proc = ssh_server.start(tmp_path / "sshd")
    state = {"server": server, "proc": proc}
    try:
        yield state
    finally:
        if state["proc"] is not None:
            ssh_server.stop(state["proc"])


def _tunnel(server: ssh_server.SSHServer, remote: Path, **more: str) -> list[str]:
    return [f"+slurm.tunnel.{k}={v}" for k, v in {**ssh_server_tunnel(server, remote, Path(sys.executable),
                                                                       server.user), **more}.items()]


def _until(proc: subprocess.Popen[str], seen: list[str], word: str, timeout: float) -> None:
    """Read ``proc``'s stdout lines into ``seen`` until one holds ``word``."""
    assert proc.stdout is not None
    began = time.monotonic()
    for line in proc.stdout:
        seen.append(line)
        if word in line:
            return
        assert time.monotonic() - began < timeout, f"no {word!r} within {timeout} s: {''.join(seen)[-2000:]}"
    raise AssertionError(f"the launcher ended before {word!r}: {''.join(seen)[-2000:]}")


def _start(repo: Path, env: dict[str, str], *overrides: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), "--config-dir", str(repo), "--config-name", "job",
                             *overrides], cwd=repo, env={**env, "PYTHONPATH": str(repo)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_dropped_connection_is_waited_out_and_the_job_followed_to_its_end(slurm_cluster, own_sshd,
                                                                            tmp_path: Path) -> None:
    """The login node goes down while ``slurm.wait=true`` follows the job and comes back 8 s later: one line while
    the launcher tries again, then the job is followed to its end as if nothing happened."""
    repo, run = repo_of(tmp_path), tmp_path / "run"
    env = local_env(tmp_path)
    proc = _start(repo, env, *_tunnel(own_sshd["server"], tmp_path / "remote"), "x=25", "+slurm.wait=true",
                  f"hydra.run.dir={run}")
    seen: list[str] = []
    try:
        _until(proc, seen, "recipe submitted started on rank 0", timeout=120)
        ssh_server.drop(own_sshd["proc"])
        time.sleep(8)
        own_sshd["proc"] = ssh_server.serve(own_sshd["server"])
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(seen) + out
    assert proc.returncode == 0, (out + err)[-4000:]
    said = (out + err).splitlines()
    assert len([line for line in said if "lost the connection" in line]) == 1, (out + err)[-3000:]
    assert [line for line in said if "reconnected to" in line], (out + err)[-3000:]
    assert "recipe submitted on rank 0 of 1" in out
    assert json.loads((run / "result.json").read_text())["x"] == 25


def test_a_connection_that_stays_lost_ends_the_wait_not_the_job(slurm_cluster, own_sshd, tmp_path: Path) -> None:
    """The login node stays down past ``slurm.tunnel.reconnect_timeout_s``: the launcher ends (not with the
    config-error status) in one line saying the job is still submitted and how to follow it; the job runs on, its
    record unchanged, and ``status`` reads its real state once the login node is back."""
    repo, run = repo_of(tmp_path), tmp_path / "run"
    env = local_env(tmp_path)
    proc = _start(repo, env, *_tunnel(own_sshd["server"], tmp_path / "remote", reconnect_timeout_s="6"), "x=40",
                  "+slurm.wait=true", f"hydra.run.dir={run}")
    seen: list[str] = []
    job_id = ""
    try:
        _until(proc, seen, "recipe submitted started on rank 0", timeout=120)
        record = (run / "launch" / "submission.json").read_text()
        job_id = json.loads(record)["job_ids"][0]
        ssh_server.drop(own_sshd["proc"])
        own_sshd["proc"] = None
        began = time.monotonic()
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - began
        assert proc.returncode not in (0, 2), (out + err)[-3000:]
        last = err.strip().splitlines()[-1]
        assert f"slurm job {job_id}" in last and "still submitted" in last, last
        for command in ("status", "logs", "cancel"):
            assert f"automodel-hydra {command} {run}" in last, last
        assert took < 60, f"{took:.0f} s"
        assert (run / "launch" / "submission.json").read_text() == record, "a lost connection changes no record"
        assert not (run / "result.json").exists()
        own_sshd["proc"] = ssh_server.serve(own_sshd["server"])
        state = json.loads(cli(env, "status", str(run), "--json").stdout)[0]["state"]
        assert state in ("RUNNING", "COMPLETED"), state
        slurm_cluster.wait_gone(job_id, timeout=120)
        deadline = time.monotonic() + 60
        while json.loads(cli(env, "status", str(run), "--json").stdout)[0]["state"] != "COMPLETED":
            assert time.monotonic() < deadline, "the job did not end COMPLETED"
            time.sleep(1)
        assert json.loads((run / "result.json").read_text())["x"] == 40  # copied back by status
    finally:
        if proc.poll() is None:
            proc.kill()
        if job_id:
            slurm_cluster.run("scancel", job_id, check=False)


# ----------------------------------------------------------------------------------------------- a container


def test_a_container_job_runs_through_the_tunnel_from_the_shipped_snapshot(slurm_cluster, sshd,
                                                                            tmp_path: Path) -> None:
    """``slurm.container_image`` through ``slurm.tunnel``: the STAND-IN of Pyxis (tests/standins/pyxis) in front of
    the cluster's real srun gives each task the image's PATH and PYTHONPATH (a python without this project) and
    checks the mounts; the tasks run the snapshot shipped to the login node, mounted with the job dir."""
    repo, run = repo_of(tmp_path), tmp_path / "run"
    env = local_env(tmp_path)
    image_bin = tmp_path / "image-bin"
    image_bin.mkdir()
    (image_bin / "python").symlink_to(getattr(sys, "_base_executable", sys.executable))
    remote = tmp_path / "remote"
    proc = launch(repo, env, *sshd.overrides(remote), "+slurm.wait=true",
                  "+slurm.container_image=nvcr.io/nvidia/nemo:25.02",
                  f"+slurm.setup=['export PATH={ROOT / 'tests' / 'standins' / 'pyxis'}:$PATH']",
                  f"+slurm.env_vars.IMAGE_PATH={image_bin}:/usr/bin:/bin", f"+slurm.env_vars.IMAGE_PYTHONPATH={SITE}",
                  f"hydra.run.dir={run}")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads((run / "result.json").read_text())
    assert result["world_size"] == 1 and result["version"] == "submitted"
    there = remote / run.relative_to("/")
    srun = next(line for line in (run / "launch" / "sbatch.sh").read_text().splitlines() if line.startswith("srun "))
    assert "--container-image=nvcr.io/nvidia/nemo:25.02" in srun and f"--container-mounts={there}:{there}" in srun
    assert str(ROOT) not in srun, "nothing of this machine's checkout is mounted"
    # imported from the shipped snapshot (the interpreter wrote its bytecode beside the copy's sources)
    assert list((there / "launch" / "code" / "lib" / "automodel_hydra" / "__pycache__").glob("worker.*.pyc"))


# ----------------------------------------------------------------------------------------------- our own records


def test_through_the_tunnel_our_records_answer_what_the_login_node_cannot(slurm_cluster, own_sshd,
                                                                          tmp_path: Path) -> None:
    """A pending array task cancelled through the tunnel (Slurm keeps no record of it) shows CANCELLED from our
    cancel record; with the login node down, a finished job shows COMPLETED from its own result with a note, and
    ``logs --no-follow`` prints the copy of its log here."""
    repo, run, sweep = repo_of(tmp_path), tmp_path / "run", tmp_path / "S"
    env, tunnel = local_env(tmp_path), _tunnel(own_sshd["server"], tmp_path / "remote")
    done = launch(repo, env, *tunnel, "x=1", "+slurm.wait=true", f"hydra.run.dir={run}")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    held = launch(repo, env, "-m", *tunnel, "x=1,2", "+slurm.detach=true", "++slurm.sbatch_args.begin=now+1hour",
                  f"hydra.sweep.dir={sweep}")
    assert held.returncode == 0, (held.stdout + held.stderr)[-3000:]
    array = json.loads((sweep / "0" / "launch" / "submission.json").read_text())["job_ids"][0].split("_")[0]
    try:
        out = cli(env, "cancel", str(sweep), "0")  # task 1 still waits: neither sacct nor squeue lists task 0 again
        assert "was PENDING, cancel requested" in out.stdout, out.stdout + out.stderr
        deadline = time.monotonic() + 30  # (slurmctld splits the pending range a moment after scancel)
        while (rows := json.loads(cli(env, "status", str(sweep), "--json").stdout))[0]["state"] == "PENDING":
            assert time.monotonic() < deadline, rows
            time.sleep(0.5)
        assert [r["state"] for r in rows] == ["CANCELLED", "PENDING"], rows
        assert "cancelled with automodel-hydra cancel while PENDING" in rows[0]["note"], rows
        assert "was PENDING, cancel requested" in cli(env, "cancel", str(sweep), "1").stdout

        ssh_server.drop(own_sshd["proc"])
        own_sshd["proc"] = None
        row = json.loads(cli(env, "status", str(run), "--json").stdout)[0]
        assert row["state"] == "COMPLETED" and row["note"].startswith("the scheduler could not be asked ("), row
        logs = cli(env, "logs", str(run), "--no-follow")
        assert logs.returncode == 0 and "recipe submitted on rank 0 of 1" in logs.stdout, logs.stderr
        rows = json.loads(cli(env, "status", str(sweep), "--json").stdout)
        assert [r["state"] for r in rows] == ["CANCELLED", "CANCELLED"], rows
    finally:
        slurm_cluster.cancel_left([array])


# ----------------------------------------------------------------------------------------------- a tcsh login shell


@pytest.fixture(scope="module")
def tcsh_login(tmp_path_factory: pytest.TempPathFactory) -> tp.Iterator[Login]:
    """A login user whose shell is tcsh (scripts/install-slurm-deps installs it), whose ``~/.cshrc`` greets and
    sets ``SBATCH_TIMELIMIT`` and ``SBATCH_JOB_NAME``, as a site's or an old session's startup file may."""
    if os.geteuid() != 0:
        pytest.skip("a second login user is made with useradd, which needs root")
    tcsh, python = shutil.which("tcsh"), _interpreter()
    if tcsh is None or shutil.which("useradd") is None or python is None:
        missing = "tcsh (scripts/install-slurm-deps)" if tcsh is None else "useradd and a python outside /root"
        if os.environ.get("CI"):
            pytest.fail(f"needs {missing}")
        pytest.skip(f"needs {missing}")
    with _login_user(tmp_path_factory, "amc", tcsh, python, {
            ".cshrc": f'echo "{GREETING}"\nsetenv SBATCH_TIMELIMIT 1\nsetenv SBATCH_JOB_NAME leftover\n'}) as user:
        yield user


def test_a_tcsh_login_with_home_fields_and_leftover_sbatch_variables(slurm_cluster, tcsh_login: Login,
                                                                      tmp_path: Path) -> None:
    """A tcsh login shell parses every remote command (a multi-line single-quoted script is "Unmatched '''" in
    csh); ``$HOME`` in ``job_dir`` and ``python`` is the login user's home, not this machine's; the login shell's
    ``SBATCH_TIMELIMIT`` / ``SBATCH_JOB_NAME`` are named in one line and left out, so the job gets the planned
    ``--time`` and ``--job-name``."""
    repo, run = repo_of(tmp_path), tmp_path / "run"
    env = {**local_env(tmp_path), "HOME": "/root"}
    proc = launch(repo, env, *tcsh_login.overrides(job_dir="$HOME/jobs", python="$HOME/venv/bin/python"),
                  "+slurm.wait=true", "+slurm.job_name=planned", f"hydra.run.dir={run}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Unmatched" not in out and "bug" not in out
    there = tcsh_login.home / "jobs" / run.relative_to("/")
    assert json.loads((there / "result.json").read_text())["version"] == "submitted"
    assert json.loads((run / "result.json").read_text())["version"] == "submitted"
    script = (run / "launch" / "sbatch.sh").read_text()
    assert f"export AUTOMODEL_JOB_DIR={there}\n" in script
    assert f"{tcsh_login.python} -u -m automodel_hydra.worker" in script
    assert "/root" not in script
    line = next(x for x in out.splitlines() if "SBATCH_TIMELIMIT" in x)
    assert "SBATCH_JOB_NAME" in line and "--time" in line and "--job-name" in line and "login shell" in line, line
    (job_id,) = json.loads((run / "launch" / "submission.json").read_text())["job_ids"]
    deadline = time.monotonic() + 30
    while (row := slurm_cluster.run("sacct", "-n", "-X", "-P", "-j", job_id, "-S", "now-1hours",  # (ids are reused)
                                    "-o", "JobName,Timelimit").stdout.split()) in ([], ["allocation|"]):
        assert time.monotonic() < deadline, row  # (slurmdbd has the job's request a moment after it ran)
        time.sleep(1)
    assert row == ["planned|00:10:00"], row
    status = cli(env, "status", str(run), "--json")
    assert [r["state"] for r in json.loads(status.stdout)] == ["COMPLETED"], status.stderr


# ----------------------------------------------------------------------------------------------- another cwd


RESUMING = '''
import os
import time


def main(cfg, dist, should_stop):
    mark = os.path.join(os.environ["AUTOMODEL_JOB_DIR"], "attempted")  # the job dir, where the ranks run
    seen = os.path.exists(mark)
    open(mark, "w").close()
    if cfg.x == 1 and not seen:  # the member the test cancels while it runs
        time.sleep(300)
    return {{"loss": 0.0, "seen": seen, "x": cfg.x}}
'''


def test_a_sweep_resumed_from_another_dir_continues_in_its_own_dirs_there(slurm_cluster, sshd,
                                                                          tmp_path: Path) -> None:
    """A sweep submitted from ``a/`` of a repo with ``hydra.sweep.dir=S``, one member cancelled while it runs,
    then the same sweep run again from ``b/`` (``hydra.sweep.dir=../a/S``): the member runs again in the dir it
    ran in on the login node (it finds what its first attempt wrote), the finished one is kept."""
    from tests import helpers

    repo = helpers.user_repo(tmp_path, RESUMING, helpers.USER_JOB.replace("my_pkg.train:main", "resrec:main"))
    for sub in ("a", "b"):  # the recipe module beside each submitting dir (tasks import the snapshot's copy of it)
        (repo / sub).mkdir()
        (repo / sub / "resrec.py").write_text(RESUMING.format())
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "two submitting dirs")
    env, remote, sweep = local_env(tmp_path), tmp_path / "remote", repo / "a" / "S"
    tunnel = sshd.overrides(remote)

    def run(cwd: Path, sweep_dir: str, *more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(ROOT / "train.py"), "--config-dir", str(repo), "--config-name",
                               "job", "-m", *tunnel, "x=1,2", f"hydra.sweep.dir={sweep_dir}", *more], cwd=cwd,
                              env={**env, "PYTHONPATH": str(cwd)}, capture_output=True, text=True, timeout=300)

    first = run(repo / "a", "S", "+slurm.detach=true")  # (returns once the array is queued)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    there = remote / sweep.relative_to("/")
    array = json.loads((sweep / "0" / "launch" / "submission.json").read_text())["job_ids"][0].split("_")[0]
    try:
        deadline = time.monotonic() + 120
        while not ((there / "0" / "attempted").exists() and (there / "1" / "result.json").exists()):
            assert time.monotonic() < deadline, sorted(str(p) for p in remote.rglob("*"))[:40]
            time.sleep(1)
        assert "was RUNNING" in cli(env, "cancel", str(sweep), "0").stdout
        slurm_cluster.wait_gone(f"{array}_0", timeout=60)
        again = run(repo / "b", "../a/S", "+slurm.detach=true")
        assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
        assert "running again: 1" in again.stdout + again.stderr, (again.stdout + again.stderr)[-3000:]
        deadline = time.monotonic() + 120
        while not (there / "0" / "result.json").exists():
            assert time.monotonic() < deadline, [p.read_text()[-2000:] for p in sorted(
                (there / "slurm").glob("*_0_0_log.out"), key=os.path.getmtime)][-1:]
            time.sleep(1)
        rows = json.loads(cli(env, "status", str(sweep), "--json").stdout)  # (copies the results back)
        assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
        result = json.loads((sweep / "0" / "result.json").read_text())
        assert (result["seen"], result["x"]) == (True, 1), result
        assert json.loads((there / "0" / "result.json").read_text())["seen"] is True
        assert not (remote / "S").exists()
    finally:
        slurm_cluster.cancel_left([array])
