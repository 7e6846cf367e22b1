"""The per-node agent that starts a job's ranks (torchrun's elastic agent, or ft_launcher's), with its own output in
the job's launch dir instead of on the terminal.

``python -m automodel_hydra.agent LAUNCH_DIR torchrun|ft_launcher ARGS...`` runs that agent's own entry point in
this process (the target of its console script: ``torch.distributed.run:main``, torchrun's;
``nvidia_resiliency_ext.fault_tolerance.launcher:main``, ft_launcher's) with the same arguments, after pointing
this process's ``sys.stdout`` and ``sys.stderr`` at ``LAUNCH_DIR/agent.<host>.log`` (appended: every attempt and
every requeue of the job keeps its lines). Everything the agent says lands there: its configuration dump, the
rendezvous rounds, "Worker group FAILED ... will restart", the per-failure summary with every failed rank's
traceback, and the lines of ft_launcher's rank monitors, which are forked from this process and write to its
streams.

The ranks are not: they are separate processes that the agent starts with this process's file descriptors, so
what they print reaches the terminal (or Slurm's log) as before, and on the terminal a failure or a restart is
told by the ranks' own lines (the hung rank's, the restarted attempt's rank 0's) and the launching command's last
line, which names this log. The exit status is the agent's.
"""

from __future__ import annotations

import importlib
import socket
import sys
import traceback
import typing as tp
from pathlib import Path

from automodel_hydra.schema import USER_ERROR_EXIT

#: The agents and their entry points (console scripts ``torchrun`` and ``ft_launcher``).
AGENTS = {"torchrun": "torch.distributed.run", "ft_launcher": "nvidia_resiliency_ext.fault_tolerance.launcher"}


def log_file(launch_dir: Path | str, host: str | None = None) -> Path:
    """``<launch dir>/agent.<host>.log``: the agent's own output on ``host`` (default: this host)."""
    return Path(launch_dir) / f"agent.{host or socket.gethostname()}.log"


def argv(launch_dir: Path | str, agent: str, python: str = "python") -> list[str]:
    """The words that run ``agent`` through this module; its own arguments follow."""
    assert agent in AGENTS, agent
    return [python, "-m", "automodel_hydra.agent", str(launch_dir), agent]


def main(args: tp.Sequence[str] | None = None) -> int:
    """Run the agent; returns its exit status."""
    from automodel_hydra import quiet

    words = list(sys.argv[1:] if args is None else args)
    if len(words) < 2 or words[1] not in AGENTS:
        print(f"usage: python -m automodel_hydra.agent LAUNCH_DIR {{{'|'.join(AGENTS)}}} ARGS...", file=sys.stderr)
        return USER_ERROR_EXIT
    launch_dir, agent, rest = words[0], words[1], words[2:]
    quiet.install()  # before torch: its import prints dependencies' lines that tell the user nothing
    path = log_file(launch_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = path.open("a", buffering=1, encoding="utf-8", errors="replace")
    sys.stdout = sys.stderr = out  # before the agent's logging is set up: its handlers take these streams
    sys.argv = [agent, *rest]
    try:
        importlib.import_module(AGENTS[agent]).main(rest)
    except SystemExit as e:
        code = e.code
        return code if isinstance(code, int) else 0 if code is None else 1
    except BaseException:  # torchrun's ChildFailedError (its summary is written above it), or the agent's own
        traceback.print_exc(file=out)
        return 1
    finally:
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
