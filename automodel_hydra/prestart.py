"""A local run's torchrun agent, started while Hydra composes: its ``import torch`` overlaps the driver's start-up.

A single local run spends about 1 s in the driver (Python and Hydra start-up, one compose, planning) before it can
start ``launch/torchrun.sh``; torchrun's agent (``python -m torch.distributed.run``) then spends 1-2.5 s importing
torch before it parses its arguments. The two are independent, so ``python train.py`` starts the agent's
interpreter first (:func:`start`, before Hydra is imported): ``python prestart.py`` imports ``torch.distributed.run``
and waits on a Unix socket. When the plan is written, the interactive backend hands it the command
(:meth:`Pending.hand_over`): bash evaluates ``torchrun.sh`` up to its one ``exec`` line (:func:`planned_exec`), so
every ``export``, ``cd`` and expansion of the script applies exactly as written, and the agent then sets that
environment and working dir and runs ``torch.distributed.run`` as ``python -m`` runs it (``__main__``, the working
dir first on ``sys.path``), holding the run lock the script would have held. The workers torchrun starts are fresh
processes, so they get the same argv, environment and working dir either way; what differs is the head process's
``/proc/PID/cmdline`` (``python .../prestart.py``).

The command is handed over only where it is the same program: the script's ``exec`` runs this interpreter with
``-m torch.distributed.run`` (not ``ft_launcher``, not an ``nsys`` prefix) and the environment the agent started
with differs from the script's only in :data:`LATE_KEYS`, which nothing reads before the hand-over. Anything else,
a sweep, a call job, a dry run, another launcher, ``AUTOMODEL_HYDRA_PRESTART=0``, or a non-Linux host: the agent is
killed (:func:`discard`) and bash runs the script as it always does. Unused, it dies with the driver
(``PR_SET_PDEATHSIG``, prctl(2)) and at the driver's exit; it never outlives it before the hand-over.

This file runs as a script in the agent, so it imports only the standard library.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import typing as tp
from pathlib import Path

#: Set to ``0`` to never start the agent early: every local run then starts ``bash launch/torchrun.sh``.
ENV = "AUTOMODEL_HYDRA_PRESTART"
#: Environment keys that may differ between the agent's start and the script's ``exec``, and why that is safe:
#: ``AUTOMODEL_RDZV_PORT`` is read by the script's rendezvous endpoint (already expanded in the argv); the
#: OpenMP thread count is read by the OpenMP runtime of processes that compute, and the agent computes nothing
#: (the workers are fresh processes that read it from their environment); ``SHLVL``, ``PWD``, ``OLDPWD`` and
#: ``_`` are bash's own, which it sets for whatever it runs.
LATE_KEYS = frozenset({"AUTOMODEL_RDZV_PORT", "OMP_NUM_THREADS", "SHLVL", "PWD", "OLDPWD", "_"})
#: What the agent runs: this interpreter, as ``python -m torch.distributed.run``.
MODULE = "torch.distributed.run"
_PROJECT_ROOT = Path(__file__).resolve().parents[1]  # what torchrun.sh puts first on PYTHONPATH (JobSpec)
_PR_SET_PDEATHSIG = 1  # prctl(2)
_NOT_LOCAL = re.compile(r"^\+{0,2}(hydra/launcher|launcher)=(?!interactive$)|^\+{0,2}(dry_run=(true|True|1)$|profile="
                        r"(?!none$)|fault_tolerance\.enabled=(true|True|1)$)")
_FLAGS_NOT_A_RUN = frozenset({"-m", "--multirun", "-c", "--cfg", "-h", "--help", "--hydra-help", "-i", "--info",
                              "-sc", "--shell-completion", "-p", "--package", "--resolve", "--version"})


def likely_local_run(argv: tp.Sequence[str]) -> bool:
    """Whether the command line ``argv`` (without the program) looks like one local run: no Hydra flag other than
    a run's (``-m``, ``--cfg``, ``--help``, ...), no other launcher, no dry run, no profiler or fault-tolerance
    launcher. A guess only, to spare a torch import where it would be thrown away; what is handed over is decided
    on the plan (:meth:`Pending.hand_over`)."""
    return not any(a in _FLAGS_NOT_A_RUN or a.startswith("--multirun") or _NOT_LOCAL.match(a) for a in argv)


def agent_env(environ: tp.Mapping[str, str]) -> dict[str, str]:
    """The environment the agent starts with: ``environ`` with what every planned ``torchrun.sh`` exports before
    Python starts (this project first on ``PYTHONPATH``, ``PYTHONUNBUFFERED=1``), so that the interpreter starts
    as the script's ``exec`` would start it."""
    env = dict(environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{_PROJECT_ROOT}:{path}" if path else str(_PROJECT_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def env_differences(started: tp.Mapping[str, str], planned: tp.Mapping[str, str]) -> list[str]:
    """Keys outside :data:`LATE_KEYS` whose value differs between the agent's start environment and the
    script's (sorted); empty means the agent may run the script's command."""
    return sorted(k for k in started.keys() | planned.keys() if k not in LATE_KEYS and started.get(k) != planned.get(k))


def planned_exec(script: Path, env: tp.Mapping[str, str], cwd: str | None) -> tuple[list[str], dict[str, str], str]:
    """What bash would ``exec`` for ``script`` started with ``env`` in ``cwd``: (argv, environment, working dir).
    bash runs the script with ``exec`` defined as a function (bash looks functions up before builtins outside
    POSIX mode: bash(1), COMMAND EXECUTION) that prints them instead, as bash's ``exec`` would pass them on (no
    ``_``, ``SHLVL`` one lower). Raises RuntimeError when bash fails or the script ends without an ``exec``."""
    probe = ('exec() { printf "%s\\0" "$@"; printf "\\1%s\\1" "$PWD"; env -0; exit 0; }; set --; source "$0"; '
             'exit 3')
    done = subprocess.run(["bash", "-c", probe, str(script)], env=dict(env), cwd=cwd, capture_output=True,
                          check=False)
    parts = done.stdout.decode().split("\1", 2)
    if done.returncode != 0 or len(parts) != 3:
        raise RuntimeError(f"bash {script}: exit {done.returncode} without an exec: "
                           f"{done.stderr.decode(errors='replace').strip()}")
    argv_part, pwd, env_part = parts
    planned = dict(kv.split("=", 1) for kv in env_part.split("\0") if "=" in kv)
    planned.pop("_", None)  # `env`'s own path: bash's exec passes no `_` on
    if planned.get("SHLVL", "").isdigit():  # bash's exec lowers the shell level by one for what it runs
        planned["SHLVL"] = str(max(0, int(planned["SHLVL"]) - 1))
    return argv_part.split("\0")[:-1], planned, pwd


class Pending:
    """A started agent waiting for its command: :meth:`hand_over` gives it one, :meth:`kill` ends it."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, env: dict[str, str]) -> None:
        self.proc, self.sock, self.env = proc, sock, env

    def hand_over(self, script: Path, env: tp.Mapping[str, str], cwd: str | None, fds: tp.Sequence[int]
                  ) -> subprocess.Popen[bytes] | None:
        """Run ``script`` (a planned ``torchrun.sh``, started with ``env`` in ``cwd``) in this agent, giving it
        ``fds`` (the run lock) as the script's process would inherit them. Returns the agent's process, now the
        run's head process; or None, the agent killed, where the script's command is not the one the agent can
        run (see the module docstring): the caller then starts the script itself."""
        try:
            argv, planned, pwd = planned_exec(script, env, cwd)
            same = argv[:3] == [sys.executable, "-m", MODULE] and not env_differences(self.env, planned)
            if same and self.proc.poll() is None:
                message = json.dumps({"argv": argv[3:], "env": planned, "cwd": pwd}).encode()
                sent = socket.send_fds(self.sock, [message], list(fds))
                self.sock.sendall(message[sent:])
                self.sock.close()
                return self.proc
        except (OSError, RuntimeError):
            pass
        self.kill()
        return None

    def kill(self) -> None:
        """End the agent (it holds nothing yet) and reap it."""
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_pending: Pending | None = None
_lock = threading.Lock()


def start(argv: tp.Sequence[str]) -> None:
    """Start the agent for the command line ``argv`` (without the program) where :func:`likely_local_run` says
    it will be used, on Linux, unless ``AUTOMODEL_HYDRA_PRESTART=0``. Call it first, before Hydra is imported:
    it is what the agent's start-up overlaps. Its stdout, stderr and stdin are the caller's, as the script's
    would be; it starts a session of its own, as the script does."""
    global _pending
    if os.environ.get(ENV, "1") == "0" or not sys.platform.startswith("linux") or not likely_local_run(argv):
        return
    ours, theirs = socket.socketpair()
    env = agent_env(os.environ)
    try:
        proc = subprocess.Popen([sys.executable, __file__, str(theirs.fileno()), str(os.getpid())], env=env,
                                pass_fds=(theirs.fileno(),), start_new_session=True)
    except OSError:
        ours.close()
        return
    finally:
        theirs.close()
    with _lock:
        _pending = Pending(proc, ours, env)
    atexit.register(discard)


def take() -> Pending | None:
    """The started agent, now the caller's to hand a command to or kill; None when there is none."""
    global _pending
    with _lock:
        pending, _pending = _pending, None
    return pending


def discard() -> None:
    """Kill the started agent if nobody took it (a no-op otherwise)."""
    pending = take()
    if pending is not None:
        pending.kill()


# ----------------------------------------------------------------------------------------------- the agent's side


def _serve(fd: int, parent: int) -> None:
    """The agent: import torchrun, wait for the command, then run it as ``python -m torch.distributed.run``."""
    del sys.path[0]  # this file's dir (the package) would shadow the standard library (its profile.py)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the driver ended before the line above
        return
    import importlib

    try:
        importlib.import_module(MODULE)  # the point of starting early: torch and torchrun's own imports
    except BaseException:  # bash then runs the script, and torchrun reports the failure there, once
        os._exit(1)
    del sys.modules[MODULE]  # run afresh as __main__ below, as `python -m` runs it
    sock = socket.socket(fileno=fd)
    message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 8)
    chunks = [message]
    while message:
        message = sock.recv(1 << 16)
        chunks.append(message)
    sock.close()
    if not chunks[0]:
        return  # the driver closed the socket: nothing to run
    libc.prctl(_PR_SET_PDEATHSIG, 0)  # from here on the run outlives its driver, as the script's process does
    command = json.loads(b"".join(chunks))
    for held in fds:
        os.set_inheritable(held, True)
    os.chdir(command["cwd"])
    os.environ.clear()
    os.environ.update(command["env"])
    sys.path.insert(0, os.getcwd())  # what `python -m` puts first
    sys.argv = [MODULE, *command["argv"]]
    import runpy

    runpy.run_module(MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
