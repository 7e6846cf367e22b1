"""Slurm through SSH (``slurm.tunnel``): the system ``ssh`` with one ControlMaster connection per command.

Planning stays on this machine and pure (:func:`remote_path` maps a local run dir to its dir on the login node);
the side effects go through :class:`Connection`: :meth:`~Connection.ship` (the launch files and the code
snapshot, one ``tar`` stream), :meth:`~Connection.run` (``sbatch``, ``sacct``/``squeue``, ``scancel``),
:meth:`~Connection.fetch` (the small files a job writes back: ``result.json``, error files, logs) and
:meth:`~Connection.read_from` (a log followed from an offset).

Why the system ``ssh`` and not a library (paramiko, fabric, which NeMo-Run's ``SSHTunnel`` uses): it is what the
user's own ``ssh HOST`` does, so ``~/.ssh/config`` (``Host`` aliases, ``ProxyJump``, ``Match``), the agent,
certificates, hardware keys, Kerberos/GSSAPI and ``known_hosts`` all work as they do in a terminal, and it adds no
dependency. ``ControlMaster`` makes every later command a new channel of the first connection (a few ms, no new
key exchange or second-factor prompt), and ``ControlPersist`` ends the master once it has been idle, so a killed
launcher leaves nothing behind for long. docs/remote.md.

Every connection runs with ``BatchMode=yes`` (never a password or passphrase prompt: a launcher must not hang on
one) and ``ConnectTimeout`` (:data:`CONNECT_TIMEOUT_S`), so a host that does not answer, a key that is refused or
a host key that is not known ends in one line (:class:`TunnelError`) within seconds.
"""

from __future__ import annotations

import atexit
import dataclasses
import io
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
import typing as tp
from pathlib import Path, PurePosixPath

from automodel_hydra.plan import PreflightError

if tp.TYPE_CHECKING:
    from automodel_hydra.backends.slurm_config import TunnelConfig

#: Seconds ssh waits for the TCP connection (ssh_config(5) ``ConnectTimeout``); the whole login is bounded by
#: :data:`LOGIN_TIMEOUT_S`.
CONNECT_TIMEOUT_S = 10
LOGIN_TIMEOUT_S = 30
#: Seconds the master connection stays up once no command uses it (``ControlPersist``); a later command of the
#: same process opens a new one.
PERSIST_S = 120
#: ssh's exit status for its own errors (ssh(1): "exits with 255 if an error occurred").
SSH_ERROR = 255


class TunnelError(PreflightError):
    """The login node cannot be used through ``slurm.tunnel``: it does not answer, it refused the key, its host
    key is unknown, or it has no ``sbatch``. One line naming which, and the fix."""


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """How to reach the login node: what ``ssh`` gets (``options``: ssh_config(5) options, as ``-o K=V``)."""

    host: str
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, tc: TunnelConfig) -> Endpoint:
        assert tc.host is not None, "a tunnel names its host"
        return cls(tc.host, tc.user, tc.port, tc.identity, tuple(sorted((str(k), str(v))
                                                                         for k, v in tc.options.items())))

    @classmethod
    def from_record(cls, data: tp.Mapping[str, tp.Any]) -> Endpoint:
        return cls(str(data["host"]), data.get("user"), data.get("port"), data.get("identity"),
                   tuple((str(k), str(v)) for k, v in data.get("options") or ()))

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    @property
    def where(self) -> str:
        """``user@host`` with its port, for messages."""
        return self.destination + (f" port {self.port}" if self.port else "")

    def ssh_args(self) -> list[str]:
        """ssh's options for this endpoint (before the destination)."""
        args = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3"]
        if self.port:
            args += ["-p", str(self.port)]
        if self.identity:
            # this key, not every key of the agent (a server closes after MaxAuthTries failed keys)
            args += ["-i", os.path.expanduser(self.identity), "-o", "IdentitiesOnly=yes"]
        for key, value in self.options:
            args += ["-o", f"{key}={value}"]
        return args


def remote_path(local: Path | str, local_root: Path | str, job_dir: str) -> PurePosixPath:
    """Where a local run dir (or a path in it) lives on the login node: ``job_dir`` plus its path relative to
    ``local_root`` (the submitting dir), or plus its absolute path when it lies outside (pure).
    ``remote_path("/w/multirun/S/0", "/w", "/scratch/me/jobs")`` -> ``/scratch/me/jobs/multirun/S/0``; a relative
    ``local`` is taken relative to ``local_root``."""
    root = PurePosixPath(os.path.normpath(str(local_root)))
    norm = PurePosixPath(os.path.normpath(str(root / local)))  # a relative path is relative to the submitting dir
    rel = norm.relative_to(root) if norm == root or root in norm.parents else norm.relative_to("/")
    return PurePosixPath(job_dir) / rel


def sh(script: str) -> str:
    """A POSIX sh script as one remote command line, whatever the user's login shell is."""
    return "sh -c " + shlex.quote(script)


@dataclasses.dataclass
class Probe:
    """What the login node answered to :meth:`Connection.probe`."""

    sbatch: str | None  # the path of sbatch, None when it has none
    max_array_size: int | None
    sbatch_export: str  # the login shell's SBATCH_EXPORT ("" when unset)


class Connection:
    """One ControlMaster connection to an endpoint, opened on first use and shared by every ssh (and tar) of this
    process; :func:`connect` hands them out, one per endpoint. Thread-safe."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._dir: str | None = None
        self._lock = threading.Lock()

    @property
    def socket(self) -> str:
        assert self._dir is not None
        return os.path.join(self._dir, "s")

    def _base(self) -> list[str]:
        return ["ssh", *self.endpoint.ssh_args(), "-o", f"ControlPath={self.socket}"]

    def open(self) -> None:
        """Log in (once): start the master connection. Raises TunnelError (one line) when the host does not
        answer, the key is refused, the host key is unknown or changed, or ssh is missing."""
        with self._lock:
            if self._dir is not None and os.path.exists(self.socket):
                return
            self._forget()  # a master that ended (idle past ControlPersist): log in again
            if shutil.which("ssh") is None:
                raise TunnelError("slurm.tunnel: ssh is not on PATH (Debian/Ubuntu: apt-get install openssh-client)")
            identity = self.endpoint.identity
            if identity and not os.path.isfile(os.path.expanduser(identity)):
                raise TunnelError(f"slurm.tunnel.identity={identity!r}: no such key file on this machine")
            self._dir = tempfile.mkdtemp(prefix="amh-ssh-")  # a short path: a unix socket name has ~100 bytes
            argv = [*self._base(), "-o", "ControlMaster=yes", "-o", f"ControlPersist={PERSIST_S}", "-N", "-f",
                    self.endpoint.destination]
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=LOGIN_TIMEOUT_S,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
            except subprocess.TimeoutExpired:
                self._forget()
                raise TunnelError(f"slurm.tunnel.host: {self.endpoint.where} does not answer: no login within "
                                  f"{LOGIN_TIMEOUT_S} s") from None
            if proc.returncode != 0 or not os.path.exists(self.socket):
                self._forget()
                raise TunnelError(login_error(self.endpoint, proc.stderr, proc.returncode))

    def _forget(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None

    def close(self) -> None:
        """End the master connection (``ssh -O exit``)."""
        with self._lock:
            if self._dir is None:
                return
            subprocess.run([*self._base(), "-O", "exit", self.endpoint.destination], capture_output=True,
                           timeout=10, stdin=subprocess.DEVNULL, check=False)
            self._forget()

    def run(self, script: str, *, input: bytes | None = None, timeout: float | None = 120.0,
            ) -> subprocess.CompletedProcess[bytes]:
        """Run the POSIX sh ``script`` on the login node (stdin: ``input``); its exit status, stdout and stderr.
        A command of its own session: a terminal's Ctrl-C reaches the launcher only, which decides (as for local
        jobs). Raises TunnelError when the connection cannot be made or is lost (ssh's 255)."""
        self.open()
        proc = subprocess.run([*self._base(), "-o", "ControlMaster=no", self.endpoint.destination, sh(script)],
                              input=input if input is not None else b"", capture_output=True, timeout=timeout,
                              start_new_session=True, check=False)
        if proc.returncode == SSH_ERROR and not os.path.exists(self.socket):
            self._forget()
            raise TunnelError(login_error(self.endpoint, proc.stderr.decode(errors="replace"), SSH_ERROR))
        return proc

    def probe(self) -> Probe:
        """One command: where sbatch is, the cluster's MaxArraySize (``scontrol show config``), SBATCH_EXPORT."""
        out = self.run('printf "sbatch=%s\\n" "$(command -v sbatch)"; command -v sbatch >/dev/null || exit 0; '
                       'printf "export=%s\\n" "${SBATCH_EXPORT-}"; '
                       "scontrol show config 2>/dev/null | grep '^MaxArraySize' || :", timeout=90)
        text = out.stdout.decode(errors="replace")
        found = dict(line.split("=", 1) for line in text.splitlines() if line.startswith(("sbatch=", "export=")))
        size = next((line.split("=", 1)[1].strip() for line in text.splitlines()
                     if line.startswith("MaxArraySize")), "")
        return Probe(found.get("sbatch") or None, int(size) if size.isdigit() else None, found.get("export", ""))

    def ship(self, base: str, files: tp.Mapping[PurePosixPath, Path | bytes], dirs: tp.Iterable[PurePosixPath] = (),
             renames: tp.Sequence[tuple[PurePosixPath, PurePosixPath]] = ()) -> None:
        """Copy ``files`` (remote path -> a local file or bytes) in one ``tar`` stream into ``base`` on the login
        node, make ``dirs``, then move each ``(tmp, final)`` of ``renames`` into place (replacing ``final``).
        Symlinks are copied as links. Raises TunnelError when the remote side fails (a full disk, no write
        permission), naming the host and what tar said."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for remote, origin in files.items():
                name = _member(remote, base)
                if isinstance(origin, bytes):
                    info = tarfile.TarInfo(name)
                    info.size, info.mode = len(origin), 0o644
                    tar.addfile(info, io.BytesIO(origin))
                else:
                    info = tar.gettarinfo(str(origin), arcname=name)
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    if info.isreg():
                        with open(origin, "rb") as f:
                            tar.addfile(info, f)
                    else:
                        tar.addfile(info)
        moves = [f"rm -rf {q(final)}.old; if [ -e {q(final)} ]; then mv {q(final)} {q(final)}.old; fi; "
                 f"mv {q(tmp)} {q(final)} && rm -rf {q(final)}.old" for tmp, final in renames]
        script = "; ".join([f"set -e; mkdir -p {q(base)}; cd {q(base)}", *(f"mkdir -p {q(d)}" for d in dirs),
                            "tar -xf -", *moves])
        proc = self.run(script, input=buf.getvalue(), timeout=600)
        if proc.returncode != 0:
            said = proc.stderr.decode(errors="replace").strip().splitlines()
            raise TunnelError(f"slurm.tunnel.job_dir={base!r}: copying the launch files to {self.endpoint.where} "
                              f"failed ({proc.returncode}): {' | '.join(said[-2:])}")

    def fetch(self, items: tp.Sequence[tuple[PurePosixPath, Path, tp.Sequence[str]]]) -> int:
        """Copy back what exists of each item's ``names`` (relative paths, sh globs allowed: ``*.log``,
        ``launch/error.rank*.json``; a dir comes with all it holds) under its remote dir into its local dir, all in
        one ``tar`` stream. Returns the number of files written; what is missing is skipped."""
        globs = " ".join(f"{q(remote)}/{_glob(n)}" for remote, _, names in items for n in names)
        if not globs:
            return 0
        script = (f"set --; for p in {globs}; do if [ -e \"$p\" ]; then set -- \"$@\" \"$p\"; fi; done; "
                  'if [ $# -gt 0 ]; then exec tar -cf - "$@" 2>/dev/null; fi')
        proc = self.run(script, timeout=600)
        if not proc.stdout:
            return 0
        written = 0
        with tarfile.open(fileobj=io.BytesIO(proc.stdout), mode="r") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                path = PurePosixPath("/" + member.name.lstrip("/"))
                for remote, local, _ in items:
                    if remote not in path.parents:
                        continue
                    rel = path.relative_to(remote)
                    if ".." in rel.parts:
                        break
                    dest = Path(local) / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    data = tar.extractfile(member)
                    assert data is not None
                    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
                    tmp.write_bytes(data.read())
                    os.replace(tmp, dest)
                    written += 1
                    break
        return written

    def read_from(self, path: PurePosixPath | str, pos: int) -> tuple[int, bytes] | None:
        """What the remote file ``path`` holds from byte ``pos`` on, as ``(offset, data)``; offset 0 when the file
        is shorter than ``pos`` (replaced or truncated: read again from its start). None when there is no file."""
        p = q(path)
        proc = self.run(f"[ -f {p} ] || exit 3; size=$(wc -c < {p}); if [ \"$size\" -lt {pos} ]; then "
                        f"printf R; cat {p}; else printf A; tail -c +{pos + 1} {p}; fi", timeout=60)
        if proc.returncode != 0 or not proc.stdout:
            return None
        return (0 if proc.stdout[:1] == b"R" else pos), proc.stdout[1:]


def q(path: PurePosixPath | str) -> str:
    return shlex.quote(str(path))


def _glob(name: str) -> str:
    """A relative name for the sh loop of :meth:`Connection.fetch`: quoted, except its ``*``."""
    return "*".join(shlex.quote(part) if part else "" for part in name.split("*"))


def _member(remote: PurePosixPath, base: str) -> str:
    rel = PurePosixPath(remote).relative_to(base)
    if ".." in rel.parts:
        raise ValueError(f"{remote} is outside {base}")
    return str(rel)


#: ssh's words (OpenSSH 7-9) for a host that does not answer, and for a refused login.
_NO_ANSWER = ("Connection refused", "Connection timed out", "timed out", "No route to host", "Network is unreachable",
              "Could not resolve hostname", "Name or service not known", "Connection closed by",
              "Connection reset", "kex_exchange_identification")
_REFUSED = ("Permission denied", "Too many authentication failures", "no mutual signature")
_HOST_KEY = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED", "No ED25519 host key",
             "host key for")


def login_error(endpoint: Endpoint, stderr: str, status: int) -> str:
    """The one line for a failed login, from ssh's own message: which of "does not answer", "refused the key",
    "host key unknown" it is, the field to look at, and ssh's last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("Warning:")]
    said = (lines[-1] if lines else f"ssh exited {status}").removeprefix("ssh: ")
    text = "\n".join(lines)
    if any(w in text for w in _HOST_KEY):
        return (f"slurm.tunnel.host: the host key of {endpoint.where} is not known here or has changed (ssh: {said}); "
                f"check it and add it to known_hosts (ssh {' '.join(_port(endpoint))}{endpoint.destination} once), "
                "or name a known_hosts file in slurm.tunnel.options.UserKnownHostsFile")
    if any(w in text for w in _REFUSED):
        key = f"the key {endpoint.identity}" if endpoint.identity else "the agent's and ~/.ssh's keys"
        return (f"slurm.tunnel.identity: {endpoint.where} refused {key} (ssh: {said}); put its public key in "
                f"~/.ssh/authorized_keys there, or set slurm.tunnel.identity / slurm.tunnel.user")
    if any(w in text for w in _NO_ANSWER):
        return (f"slurm.tunnel.host: {endpoint.where} does not answer (ssh: {said}); check slurm.tunnel.host and "
                "slurm.tunnel.port, and that this machine reaches it (VPN, ProxyJump)")
    return f"slurm.tunnel: ssh {endpoint.where} failed ({status}): {said}"


def _port(endpoint: Endpoint) -> list[str]:
    return [f"-p {endpoint.port} "] if endpoint.port else []


def no_sbatch_line(endpoint: Endpoint) -> str:
    return (f"slurm.tunnel.host: {endpoint.where} has no sbatch on the PATH of a non-interactive ssh command "
            "(ssh HOST 'command -v sbatch' finds none): name the cluster's login node, or put the Slurm client on "
            "PATH in the shell's startup file there (~/.bashrc, ~/.ssh/environment)")


_CONNECTIONS: dict[Endpoint, Connection] = {}
_LOCK = threading.Lock()


def connect(endpoint: Endpoint) -> Connection:
    """This process's connection to ``endpoint`` (made on first use; closed at exit)."""
    with _LOCK:
        conn = _CONNECTIONS.get(endpoint)
        if conn is None:
            conn = _CONNECTIONS[endpoint] = Connection(endpoint)
        return conn


@atexit.register
def close_all() -> None:
    """End every master connection this process opened."""
    with _LOCK:
        conns = list(_CONNECTIONS.values())
        _CONNECTIONS.clear()
    for conn in conns:
        try:
            conn.close()
        except (OSError, subprocess.SubprocessError):
            pass


__all__ = ["CONNECT_TIMEOUT_S", "Connection", "Endpoint", "Probe", "TunnelError", "close_all", "connect",
           "login_error", "no_sbatch_line", "remote_path", "sh"]
