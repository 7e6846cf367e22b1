"""Slurm through SSH (``slurm.tunnel``): the :class:`~automodel_hydra.backends.slurm_transport.Transport` of a
login node, the system ``ssh`` with one ControlMaster connection per command.

Planning stays on this machine and pure (:func:`remote_path` maps a local run dir to its dir on the login node);
the side effects go through :class:`SSH`: :meth:`~SSH.put` (the launch files and the code snapshot, one ``tar``
stream), :meth:`~SSH.run` (``sbatch``, ``sacct``/``squeue``, ``scancel``), :meth:`~SSH.get` (the small files a job
writes back: ``result.json``, error files, logs) and :meth:`~SSH.read_from` (a log followed from an offset).
Each command's own output is read between markers, whatever the login shell prints around it (:class:`SSH`).

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
import re
import secrets
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
import typing as tp
from pathlib import Path, PurePosixPath

from automodel_hydra.backends.slurm_transport import HERE, ConnectionLost, GetItem, Output, Transport
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


def remote_path(local: Path | str, job_dir: str) -> PurePosixPath:
    """Where a local run dir (or a path in it) lives on the login node: ``job_dir`` plus its absolute path here
    (pure). ``remote_path("/w/multirun/S/0", "/scratch/me/jobs")`` -> ``/scratch/me/jobs/w/multirun/S/0``. A
    function of the dir alone, never of the dir a command runs from: a rerun from another dir, a resume and every
    member of a sweep find the dirs the first launch made. A relative ``local`` is made absolute here first."""
    return PurePosixPath(job_dir) / PurePosixPath(os.path.abspath(str(local))).relative_to("/")


#: Bytes a remote command line carries as they are (:func:`sh`): nothing any login shell's quoting, sh's double
#: quotes or printf's format reads specially.
_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 _./,:=+-@")


def sh(script: str) -> str:
    """A POSIX sh script as one remote command line that every login shell parses alike (sshd runs it with the
    user's shell, ``$SHELL -c LINE``: bash, dash, zsh, tcsh/csh, fish): ``sh -c 'eval "$(printf "...")"'`` with
    the script in printf's format, each byte outside :data:`_PLAIN` as a 3-digit octal escape (POSIX printf(1):
    ``\\ddd``). The line holds no newline, ``!``, quote or ``%`` of the script, and its backslashes are always
    before a digit: csh's single quotes end at a newline and keep ``!`` history, fish's read ``\\\\`` and ``\\'``,
    and none of that can occur, whatever paths the script names. Needs nothing but ``sh`` there (its printf)."""
    body = "".join(chr(b) if b in _PLAIN else f"\\{b:03o}" for b in script.encode())
    return f"""sh -c 'eval "$(printf "{body}")"'"""


class SSH(Transport):
    """One ControlMaster connection to an endpoint, opened on first use and shared by every ssh of this process;
    :func:`connect` hands them out, one per endpoint. Thread-safe.

    Every command runs as ``sh`` under the login shell (whatever its syntax: :func:`sh`), between two random
    markers that it prints first and last on stdout and stderr (with its exit status): what the login shell prints
    before or after it (a ``.bashrc`` ``echo``, an MOTD script, a ``module load`` message) is outside them and
    never taken for the command's output, so ``sbatch --parsable``'s job id, a ``tar`` stream or a log's bytes
    are read as the command wrote them."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._dir: str | None = None
        self._lock = threading.Lock()

    @property
    def where(self) -> str:  # type: ignore[override]
        return self.endpoint.where

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
            self._forget()  # a master that ended (idle past ControlPersist, or its connection dropped): log in again
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

    def run(self, argv: tp.Sequence[str], *, env: tp.Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float = 120.0, unset: tp.Sequence[str] = ()) -> Output:
        """:meth:`Transport.run` on the login node: the values of ``env`` go on ssh's stdin, one line each, and
        are read into the command's environment there (never on a command line). Raises ValueError for a value
        with a line break or NUL (it cannot be sent so)."""
        env = dict(env or {})
        for name, value in env.items():
            if "\n" in value or "\0" in value:
                raise ValueError(f"${name} holds a line break, which cannot be passed through slurm.tunnel")
        reads = "".join(f"IFS= read -r {name}; export {name}; " for name in env)
        reads += f"unset {' '.join(map(q, unset))}; " if unset else ""
        script = f"{reads}cd {q(cwd)} && {{ {shlex.join(argv)}\n}}" if cwd else f"{reads}{shlex.join(argv)}"
        return self.sh(script, input="".join(v + "\n" for v in env.values()).encode(), timeout=timeout)

    def sh(self, script: str, *, input: bytes = b"", timeout: float = 120.0) -> Output:
        """Run the POSIX sh ``script`` on the login node (stdin: ``input``); its own exit status, stdout and
        stderr (see the class docstring). A command of its own session: a terminal's Ctrl-C reaches the launcher
        only, which decides (as for local jobs). Raises ConnectionLost when the connection drops or no answer
        comes within ``timeout`` seconds, TunnelError when no login is possible."""
        self.open()
        token = f"amh-{secrets.token_hex(8)}"
        marked = (f"printf '%s\\n' {token}; printf '%s\\n' {token} >&2; ({script}\n); s=$?; "
                  f"printf '\\n%s %s\\n' {token}.end \"$s\"; printf '\\n%s\\n' {token}.end >&2; exit \"$s\"")
        try:
            proc = subprocess.run([*self._base(), "-o", "ControlMaster=no", self.endpoint.destination, sh(marked)],
                                  input=input, capture_output=True, timeout=timeout, start_new_session=True,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise ConnectionLost(f"slurm.tunnel: {self.where} gave no answer within {timeout:g} s") from None
        out, status = _between(proc.stdout, token, with_status=True)
        err, _ = _between(proc.stderr, token)
        if status is None:  # the command never ended there: the connection dropped (or never came up)
            said = proc.stderr.decode(errors="replace")
            if not os.path.exists(self.socket):
                self._forget()
            raise ConnectionLost(f"slurm.tunnel: the connection to {self.where} was lost "
                                 f"({(said.strip().splitlines() or [f'ssh exited {proc.returncode}'])[-1]})")
        return Output(status, out or b"", err if err is not None else proc.stderr)

    def put(self, files: tp.Mapping[PurePosixPath, Path | bytes], *, dirs: tp.Iterable[PurePosixPath] = (),
            renames: tp.Sequence[tuple[PurePosixPath, PurePosixPath]] = ()) -> None:
        """:meth:`Transport.put` as one ``tar`` stream, unpacked there by the login user (``--no-same-owner``)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for remote, origin in files.items():
                name = _member(remote)
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
        script = "; ".join(["set -e", *(f"rm -rf {q(tmp)}" for tmp, _ in renames),
                            *(f"mkdir -p {q(d)}" for d in dirs), "tar --no-same-owner -xf - -C /", *moves])
        out = self.sh(script, input=buf.getvalue(), timeout=600)
        if out.returncode != 0:
            under = os.path.commonpath([str(p) for p in files]) if files else "/"
            raise TunnelError(f"slurm.tunnel.job_dir: copying the launch files to {under} on {self.where} failed "
                              f"({out.returncode}): {out.said(2)}")

    def get(self, items: tp.Sequence[GetItem]) -> int:
        """:meth:`Transport.get` as one ``tar`` stream from the login node."""
        globs = " ".join(f"{q(remote)}/{_glob(n)}" for remote, _, names in items for n in names)
        if not globs:
            return 0
        script = (f"set --; for p in {globs}; do if [ -e \"$p\" ]; then set -- \"$@\" \"$p\"; fi; done; "
                  'if [ $# -gt 0 ]; then tar -cf - "$@" 2>/dev/null; fi')
        out = self.sh(script, timeout=600)
        if not out.stdout:
            return 0
        written = 0
        with tarfile.open(fileobj=io.BytesIO(out.stdout), mode="r") as tar:
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
        p = q(path)
        out = self.sh(f"[ -f {p} ] || exit 3; size=$(wc -c < {p}); if [ \"$size\" -lt {pos} ]; then "
                      f"printf R; cat {p}; else printf A; tail -c +{pos + 1} {p}; fi", timeout=60)
        if out.returncode != 0 or not out.stdout:
            return None
        return (0 if out.stdout[:1] == b"R" else pos), out.stdout[1:]

    def missing_line(self, command: str) -> str:
        return (f"slurm.tunnel.host: {self.where} has no {command} on the PATH of a non-interactive ssh command "
                f"(ssh HOST 'command -v {command}' finds none): name the cluster's login node, or put the Slurm "
                "client on PATH in the shell's startup file there (~/.bashrc, ~/.ssh/environment)")


def _between(data: bytes, token: str, with_status: bool = False) -> tuple[bytes | None, int | None]:
    """What a marked command wrote between its markers (see :class:`SSH`), and its exit status when
    ``with_status``; ``(None, None)`` when the markers are not both there."""
    start = data.find(token.encode() + b"\n")
    if start < 0:
        return None, None
    body = data[start + len(token) + 1:]
    end = body.rfind(b"\n" + token.encode() + b".end")
    if end < 0:
        return None, None
    status = None
    if with_status:
        word = body[end + len(token) + 5:].split(b"\n", 1)[0].strip()
        if not word.isdigit():
            return None, None
        status = int(word)
    return body[:end], status


def q(path: PurePosixPath | str) -> str:
    return shlex.quote(str(path))


def _glob(name: str) -> str:
    """A relative name for the sh loop of :meth:`SSH.get`: quoted, except its ``*``."""
    return "*".join(shlex.quote(part) if part else "" for part in name.split("*"))


def _member(remote: PurePosixPath) -> str:
    """A tar member's name for an absolute path there (unpacked under ``/``)."""
    path = PurePosixPath(remote)
    if not path.is_absolute() or ".." in path.parts:
        raise ValueError(f"{remote}: not an absolute path without '..'")
    return str(path.relative_to("/"))


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


def reconnect(endpoints: tp.Sequence[Endpoint], budget_s: float, *, first_s: float = 1.0, most_s: float = 10.0,
              sleep: tp.Callable[[float], None] = time.sleep,
              clock: tp.Callable[[], float] = time.monotonic) -> Exception | None:
    """Try to reach every endpoint again (one trivial command each), with backoff (``first_s`` doubling up to
    ``most_s`` seconds between tries), for at most ``budget_s`` seconds. Returns None once all answer, else the last
    ConnectionLost / TunnelError."""
    began, delay = clock(), first_s
    while True:
        try:
            for endpoint in endpoints:
                connect(endpoint).run(["true"], timeout=30)
            return None
        except (ConnectionLost, TunnelError) as e:
            lost: Exception = e
        if clock() - began + delay > budget_s:
            return lost
        sleep(delay)
        delay = min(delay * 2, most_s)


def said(error: Exception) -> str:
    """What ssh said of a failed or lost connection (a login error's ``(ssh: ...)``), else the error's line."""
    m = re.search(r"\(ssh: (.*?)\)(?:;|$)", str(error))
    return m.group(1) if m else str(error).removeprefix("slurm.tunnel: ")


_CONNECTIONS: dict[Endpoint, SSH] = {}
_LOCK = threading.Lock()


def connect(endpoint: Endpoint) -> SSH:
    """This process's connection to ``endpoint`` (made on first use; closed at exit)."""
    with _LOCK:
        conn = _CONNECTIONS.get(endpoint)
        if conn is None:
            conn = _CONNECTIONS[endpoint] = SSH(endpoint)
        return conn


def transport(endpoint: Endpoint | None) -> Transport:
    """Where a job's commands run: this machine (``endpoint`` None: no ``slurm.tunnel``), else its login node."""
    return HERE if endpoint is None else connect(endpoint)


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


__all__ = ["CONNECT_TIMEOUT_S", "SSH", "Endpoint", "TunnelError", "close_all", "connect", "login_error", "reconnect",
           "remote_path", "said", "sh", "transport"]
