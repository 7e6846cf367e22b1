"""pytest plugin: a real OpenSSH server on loopback, in front of the test Slurm cluster (``slurm.tunnel`` tests).

Loaded from ``tests/conftest.py``. The session fixture ``sshd`` starts Debian's ``sshd`` (openssh-server, installed by
``scripts/install-slurm-deps``) on two free loopback ports with a host key and a client key made here; only that
client key may log in (as the user running the tests: root, which the Slurm cluster needs anyway). Sessions get the
cluster's ``SLURM_CONF`` and a ``PATH`` with the Slurm client through ``SetEnv`` (sshd_config(5)), so the SSH side,
and only it, can submit; on the second port (``Match LocalPort``) ``PATH`` holds a shell and nothing of Slurm:
a login node without ``sbatch``. ``UsePAM no`` and ``StrictModes no``: no PAM stack and no ownership rules for
the test's temporary key files. The server is stopped at the end of the session.

A test that needs a server of its own (another login user, a login node that restarts) calls :func:`start` with
``users`` (more login users, each with the same client key) and, to take the server down and up again on the same
ports, :func:`drop` (every connection ends, as when a login node reboots) and :func:`serve`.

Without ``sshd`` (or not as root) the fixture skips, naming the install command; under ``CI`` it fails.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.slurm_cluster import INSTALL_COMMAND, REPO_ROOT

SSHD = "/usr/sbin/sshd"


@dataclasses.dataclass
class SSHServer:
    """A running sshd: ``port`` has the Slurm client, ``bare_port`` has none; ``key`` may log in, ``other_key``
    may not; ``known_hosts`` holds the host key for both ports."""

    dir: Path
    port: int
    bare_port: int
    key: Path
    other_key: Path
    known_hosts: Path
    user: str

    def tunnel(self, job_dir: Path | str, *, port: int | None = None, key: Path | None = None,
               python: str | None = None, user: str | None = None) -> dict[str, tp.Any]:
        """A ``slurm.tunnel`` section for this server."""
        return {"host": "127.0.0.1", "user": user or self.user, "port": port or self.port,
                "identity": str(key or self.key), "job_dir": str(job_dir),
                "python": python or sys.executable,
                "options": {"UserKnownHostsFile": str(self.known_hosts), "StrictHostKeyChecking": "yes"}}

    def overrides(self, job_dir: Path | str, **kw: tp.Any) -> list[str]:
        """The same as Hydra command-line overrides (``+slurm.tunnel.host=...``)."""
        out = []
        for k, v in self.tunnel(job_dir, **kw).items():
            if isinstance(v, dict):
                out += [f"+slurm.tunnel.{k}.{kk}={vv}" for kk, vv in v.items()]
            else:
                out.append(f"+slurm.tunnel.{k}={v}")
        return out


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "automodel-hydra-test", "-f", str(path)],
                   check=True, capture_output=True)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 10.0) -> None:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited {proc.returncode}:\n{log.read_text(errors='replace')}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd does not listen on {port} after {timeout} s:\n{log.read_text(errors='replace')}")


def start(d: Path, users: tp.Sequence[str] = ()) -> tuple[SSHServer, subprocess.Popen[bytes]]:
    """Start the sshd of the module docstring with its keys and config in ``d`` (``users``: login users besides
    the one running the tests); returns it and its process. Raises RuntimeError when it does not come up."""
    for name in ("host_key", "client_key", "other_key"):
        _keygen(d / name)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    bare = d / "bare-bin"  # a login node without Slurm: a shell and what the probe pipes through
    bare.mkdir()
    for tool in ("sh", "grep"):
        (bare / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    state = Path(os.environ.get("SLURM_CLUSTER_DIR") or REPO_ROOT / ".slurm-cluster").resolve()
    port, bare_port = free_port(), free_port()
    host_pub = (d / "host_key.pub").read_text().split()[:2]
    (d / "known_hosts").write_text("".join(f"[127.0.0.1]:{p} {' '.join(host_pub)}\n" for p in (port, bare_port)))
    path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation dir
    import pwd

    user = pwd.getpwuid(os.geteuid()).pw_name
    for other in users:  # sshd reads a user's keys as that user: the key goes into their own ~/.ssh
        entry = pwd.getpwnam(other)
        ssh_dir = Path(entry.pw_dir) / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text((d / "client_key.pub").read_text())
        for owned in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(owned, entry.pw_uid, entry.pw_gid)
    (d / "sshd_config").write_text(f"""\
Port {port}
Port {bare_port}
ListenAddress 127.0.0.1
HostKey {d}/host_key
AuthorizedKeysFile {d}/authorized_keys .ssh/authorized_keys
PidFile {d}/sshd.pid
UsePAM no
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
AllowUsers {" ".join([user, *users])}
MaxStartups 100
MaxSessions 100
SetEnv SLURM_CONF={state / "etc" / "slurm.conf"} PATH={path}
Match LocalPort {bare_port}
    SetEnv PATH={bare}
""")
    server = SSHServer(d, port, bare_port, d / "client_key", d / "other_key", d / "known_hosts", user)
    return server, serve(server)


def serve(server: SSHServer) -> subprocess.Popen[bytes]:
    """Start sshd with the config :func:`start` wrote in ``server.dir``, on the same ports; its process. Raises
    RuntimeError when it does not come up."""
    log = server.dir / "sshd.log"
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(server.dir / "sshd_config")], stdout=subprocess.DEVNULL,
                            stderr=log.open("ab"), start_new_session=True)
    try:
        _wait_listening(server.port, proc, log)
        _wait_listening(server.bare_port, proc, log)
    except BaseException:
        stop(proc)
        raise
    return proc


def drop(proc: subprocess.Popen[bytes]) -> None:
    """Take the server down with every connection it holds, as a login node that reboots: the per-connection
    sshd processes (children of the listener, each in a session of its own) are killed, then the listener."""
    children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(int(p.name)) == proc.pid]
    for pid in children:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    stop(proc)


def _parent(pid: int) -> int | None:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> tp.Iterator[SSHServer]:
    """A real sshd on loopback whose sessions see the test cluster's SLURM_CONF (see the module docstring)."""
    missing = [t for t in (SSHD, "ssh", "ssh-keygen") if shutil.which(t) is None]
    reason = (f"the tunnel tests need {', '.join(missing)}: install openssh-server with {INSTALL_COMMAND}"
              if missing else "the tunnel tests run sshd as root" if os.geteuid() != 0 else None)
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set)", pytrace=False)
        pytest.skip(reason)
    try:
        server, proc = start(tmp_path_factory.mktemp("sshd"))
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield server
    finally:
        stop(proc)
