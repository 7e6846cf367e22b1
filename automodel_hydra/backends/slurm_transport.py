"""Where the Slurm backend's commands run and its jobs' files live: this machine (:class:`Here`), or the login node
of ``slurm.tunnel`` (:class:`automodel_hydra.backends.slurm_tunnel.SSH`), behind one small interface.

:class:`Transport` has four operations, and :mod:`automodel_hydra.backends.slurm` has one body for each of its own
(``submit``, ``states``, ``cancel``, ``wait``, ``read_log``, ``fetch_results``) on top of them:

* :meth:`~Transport.run` runs one command (an argv) and returns *its own* exit status, stdout and stderr: nothing a
  login shell prints around it (a ``.bashrc`` ``echo``, an MOTD script, a ``module load`` message) is part of it;
* :meth:`~Transport.put` puts files (the launch files, the code snapshot) where the cluster reads them;
* :meth:`~Transport.get` copies what jobs wrote there back into their local dirs;
* :meth:`~Transport.read_from` reads a file (a log being written) from a byte offset.

Paths on the transport's side are :class:`~pathlib.PurePosixPath`; on this machine :class:`Here`'s are the same
paths, so putting a file onto itself and getting a dir from itself do nothing.

:class:`ConnectionLost` is the one error of a transport that worked before and cannot be asked now (a dropped
connection, a login node restarting); it never means a job's state changed.
"""

from __future__ import annotations

import abc
import codecs
import dataclasses
import os
import shutil
import subprocess
import sys
import typing as tp
from pathlib import Path, PurePosixPath

from automodel_hydra.bootstrap import is_launcher_var
from automodel_hydra.plan import read_from

#: The exit status a POSIX shell gives a command it cannot find (POSIX.1 "Command Search and Execution").
NOT_FOUND = 127
#: The exit status of a command that ran past its time (what coreutils' ``timeout`` returns).
TIMED_OUT = 124


@dataclasses.dataclass(frozen=True)
class Output:
    """What one command wrote and how it ended: its own exit status, stdout and stderr (bytes)."""

    returncode: int
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")

    def said(self, lines: int = 3) -> str:
        """The command's last ``lines`` lines of stderr (else of stdout), joined with ``" | "``, for a one-line
        error."""
        err, out = self.stderr.decode(errors="replace").strip(), self.text.strip()
        return " | ".join((err or out).splitlines()[-lines:])


class ConnectionLost(RuntimeError):
    """The cluster cannot be asked now although it could before (the SSH connection dropped, the login node is
    restarting, a command got no answer in time). Nothing is known about the jobs from it: their states stay as
    they were recorded. One line naming the host and what ssh said."""


#: ``(dir there, dir here, names)``: what :meth:`Transport.get` copies, each name a path relative to the dir,
#: ``*`` allowed (``launch/error.rank*.json``; a dir comes with all it holds).
GetItem = tuple[PurePosixPath, Path, tp.Sequence[str]]


class Transport(abc.ABC):
    """Runs commands and moves files where Slurm is: this machine or a login node."""

    #: the side, for messages: ``"this machine"``, ``"me@login port 22"``
    where: str

    @abc.abstractmethod
    def run(self, argv: tp.Sequence[str], *, env: tp.Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float = 120.0, unset: tp.Sequence[str] = ()) -> Output:
        """Run ``argv`` (``argv[0]`` looked up on that side's PATH) in ``cwd`` (None: where commands start there)
        with ``env`` added to its environment, the values never on a command line nor in a file, and the
        variables ``unset`` (names) taken out of it. Returns its own
        :class:`Output`; a command that cannot be found exits :data:`NOT_FOUND`, one past ``timeout`` seconds
        :data:`TIMED_OUT`. Raises ConnectionLost (or, before any login worked, the tunnel's one-line
        PreflightError) when the other side cannot be reached."""

    @abc.abstractmethod
    def put(self, files: tp.Mapping[PurePosixPath, Path | bytes], *, dirs: tp.Iterable[PurePosixPath] = (),
            renames: tp.Sequence[tuple[PurePosixPath, PurePosixPath]] = ()) -> None:
        """Write ``files`` (path there -> a local file, copied with its mode, a symlink as a link; or bytes), make
        ``dirs``, then move each ``(tmp, final)`` of ``renames`` into place, replacing ``final`` (a dir whose
        ``tmp`` is made afresh: a snapshot is never half there). Raises OSError (here) or the tunnel's
        PreflightError naming the host and what failed (a full disk, no write permission)."""

    @abc.abstractmethod
    def get(self, items: tp.Sequence[GetItem]) -> int:
        """Copy what exists of each item's names under its dir there into its dir here (missing ones skipped);
        returns the number of files written."""

    @abc.abstractmethod
    def read_from(self, path: PurePosixPath | str, pos: int) -> tuple[int, bytes] | None:
        """What the file ``path`` holds from byte ``pos`` on, as ``(offset, data)``: offset 0 when the file is
        shorter than ``pos`` (replaced or truncated, a requeued job's log: read from its start again); None while
        there is no file."""

    def missing_line(self, command: str) -> str:
        """The one line for a Slurm command that this side does not have on its PATH."""
        return (f"{command} is not on PATH: run on a Slurm login node, or make the Slurm client available (HPC: "
                "`module load slurm`; Debian/Ubuntu: `apt-get install slurm-client`)")


def submit_env() -> dict[str, str]:
    """This environment without the variables of an enclosing Slurm job (submitit's ``clean_env``) and of any
    launcher that started this shell (:func:`automodel_hydra.bootstrap.is_launcher_var`: torchrun's,
    ft_launcher's, SkyPilot's), keeping SLURM_CONF, which names the cluster: ``sbatch`` exports the rest to the
    job, and a job's ranks would otherwise inherit that job's ``SLURM_*`` settings (sbatch(1), "INPUT ENVIRONMENT
    VARIABLES") or a notebook's ``TORCHELASTIC_RUN_ID``."""
    return {k: v for k, v in os.environ.items() if k == "SLURM_CONF" or not is_launcher_var(k)}


class Here(Transport):
    """This machine: commands are subprocesses in :func:`submit_env`, files are where they are."""

    where = "this machine"

    def run(self, argv: tp.Sequence[str], *, env: tp.Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float = 120.0, unset: tp.Sequence[str] = ()) -> Output:
        environ = {k: v for k, v in {**submit_env(), **(env or {})}.items() if k not in unset}
        try:
            proc = subprocess.run(list(argv), capture_output=True, timeout=timeout, cwd=cwd, check=False,
                                  env=environ, stdin=subprocess.DEVNULL)
        except FileNotFoundError as e:
            return Output(NOT_FOUND, stderr=f"{argv[0]}: {e.strerror}".encode())
        except subprocess.TimeoutExpired:
            return Output(TIMED_OUT, stderr=f"{argv[0]}: no answer within {timeout:g} s".encode())
        except OSError as e:
            return Output(NOT_FOUND, stderr=f"{argv[0]}: {e}".encode())
        return Output(proc.returncode, proc.stdout, proc.stderr)

    def put(self, files: tp.Mapping[PurePosixPath, Path | bytes], *, dirs: tp.Iterable[PurePosixPath] = (),
            renames: tp.Sequence[tuple[PurePosixPath, PurePosixPath]] = ()) -> None:
        for tmp, _ in renames:
            shutil.rmtree(tmp, ignore_errors=True)
        made: set[Path] = set()
        for there, origin in files.items():
            dest = Path(there)
            if isinstance(origin, Path) and os.path.abspath(origin) == os.path.abspath(dest):
                continue  # already where the cluster reads it (this machine's launch files)
            if dest.parent not in made:
                dest.parent.mkdir(parents=True, exist_ok=True)
                made.add(dest.parent)
            if isinstance(origin, bytes):
                dest.write_bytes(origin)
            elif origin.is_symlink():
                os.symlink(os.readlink(origin), dest)
            else:
                shutil.copy2(origin, dest)
        for d in dirs:
            Path(d).mkdir(parents=True, exist_ok=True)
        for tmp, final in renames:
            replace_dir(Path(tmp), Path(final))

    def get(self, items: tp.Sequence[GetItem]) -> int:
        written = 0
        for there, here, names in items:
            if Path(there) == Path(here):
                continue  # the job wrote here
            for name in names:
                for path in sorted(Path(there).glob(name)):
                    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
                    for f in files:
                        dest = Path(here) / f.relative_to(there)
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(f, dest)
                        written += 1
        return written

    def read_from(self, path: PurePosixPath | str, pos: int) -> tuple[int, bytes] | None:
        return read_from(Path(path), pos)  # (the contract's own reader of a local file)


def replace_dir(tmp: Path, final: Path) -> None:
    """Move the dir ``tmp`` to ``final``, replacing what is there: the old one is moved aside first and removed
    after, so ``final`` is never half written."""
    if final.exists():
        old = final.with_name(f".{final.name}.{os.getpid()}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


#: This machine's transport (it holds no state).
HERE = Here()


@dataclasses.dataclass(frozen=True)
class Probe:
    """What one side answered to :func:`probe`: the path of ``sbatch`` (None: not on its PATH), the cluster's
    MaxArraySize (None: unknown), its ``SBATCH_EXPORT`` ("" when unset), its ``$HOME`` (None: unknown), what
    ``sinfo`` says of its partitions' nodes (:data:`SINFO_FORMAT` lines; "": no answer) and the names of the
    ``SBATCH_*`` variables set there (:data:`~automodel_hydra.backends.slurm_script.SBATCH_INPUT_VARS`)."""

    sbatch: str | None
    max_array_size: int | None
    sbatch_export: str
    home: str | None = None
    partitions: str = ""
    sbatch_vars: tuple[str, ...] = ()


#: ``sinfo --all --exact --noheader --format``: partition (``*`` after the default one), CPUs per node, Gres,
#: node count, MaxTime, job size in nodes (``MIN-MAX``), memory per node in MB (sinfo(1), "--format"); one line per
#: partition, node configuration (``--exact``: nodes that differ are not folded into ``2+``) and node state. Read by
#: :func:`automodel_hydra.backends.slurm_limits.parse_sinfo`.
SINFO_FORMAT = "%P|%c|%G|%D|%l|%s|%m"
#: One command, whatever the side: where sbatch is, $HOME, SBATCH_EXPORT, the cluster's MaxArraySize
#: (``scontrol show config``, slurm.conf(5)), its partitions' nodes and limits (``sinfo``, each line prefixed
#: ``partition=``; :mod:`~automodel_hydra.backends.slurm_limits`) and the names (never the values) of the
#: ``SBATCH_*`` variables its shell sets (``var=``); each answer on a line of its own.
_PROBE = ('printf "sbatch=%s\\n" "$(command -v sbatch)"; printf "home=%s\\n" "${HOME-}"; '
          'printf "export=%s\\n" "${SBATCH_EXPORT-}"; scontrol show config 2>/dev/null | grep "^MaxArraySize" || :; '
          f"sinfo --all --exact --noheader --format='{SINFO_FORMAT}' 2>/dev/null | sed 's/^/partition=/' || :; "
          "env | sed -n 's/^\\(SBATCH_[A-Za-z0-9_]*\\)=.*/var=\\1/p' || :")


def probe(transport: Transport) -> Probe:
    """Ask ``transport``'s side, in one command, what :class:`Probe` holds. A side that cannot run it (no
    ``sh`` on this machine's PATH) answers nothing; a login node that cannot be reached raises (its transport's
    error)."""
    out = transport.run(["sh", "-c", _PROBE], timeout=90)
    lines = out.text.splitlines()
    found = dict(line.split("=", 1) for line in lines if line.startswith(("sbatch=", "export=", "home=")))
    size = next((line.split("=", 1)[1].strip() for line in lines if line.startswith("MaxArraySize")), "")
    partitions = "\n".join(line.split("=", 1)[1] for line in lines if line.startswith("partition="))
    names = tuple(line.split("=", 1)[1] for line in lines if line.startswith("var="))
    return Probe(found.get("sbatch") or None, int(size) if size.isdigit() else None, found.get("export", ""),
                 found.get("home") or None, partitions, names)



class Follower:
    """Prints what a log gains (``tail -f``), from its start; ``read(offset)`` reads it where it is written,
    ``(offset, data)`` or None while there is none."""

    def __init__(self, read: tp.Callable[[int], tuple[int, bytes] | None]) -> None:
        self.pos, self.read = 0, read
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a read may end mid-character

    def poll(self) -> None:
        got = self.read(self.pos)
        if got is None:
            return
        self.pos, data = got
        self.pos += len(data)
        if data:
            sys.stdout.write(self.decoder.decode(data))
            sys.stdout.flush()


__all__ = ["HERE", "NOT_FOUND", "SINFO_FORMAT", "TIMED_OUT", "ConnectionLost", "Follower", "GetItem", "Here",
           "Output", "Probe", "Transport", "probe", "replace_dir", "submit_env"]
