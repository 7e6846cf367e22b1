"""Every stop stops, with real processes: SIGINT to a local sweep's launching command by pid (as ``timeout -s INT``
or a CI step timeout sends it), SIGTERM to a single run whose rank 1 hangs inside its step (rank 0 blocked in
``all_reduce``: neither reads its stop flag), and ``automodel-hydra cancel`` of such a run. After each, no process
of the job is left, within ``interactive.kill_wait_s`` plus a few seconds, and the command's last line says what
was stopped and how it ended (docs/architecture.md, "Stopping").

2 CPU ranks (gloo). The hanging recipe is a user function, ``tests.hang_recipe:main``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra.stops import alive, tree
from tests.helpers import ROOT, wait_for, worker_pids

pytestmark = pytest.mark.slow

GRACE_S = 5


class Cmd:
    """``python train.py ARGS`` in the background, output in a file; :meth:`close` kills what is left."""

    def __init__(self, out: Path, args: tp.Sequence[str], cwd: Path) -> None:
        self.out_path = out
        self._out = open(out, "w")  # noqa: SIM115
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env=env,
                                     stdout=self._out, stderr=subprocess.STDOUT)
        self.seen: set[int] = set()

    @property
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def last_line(self) -> str:
        return self.output.strip().splitlines()[-1]

    def watch(self) -> set[int]:
        """Every process below the command now, added to those seen before (they may be orphaned later)."""
        self.seen |= set(tree(self.proc.pid))
        return self.seen

    def until(self, cond: tp.Callable[[], tp.Any], timeout: float, what: str) -> tp.Any:
        """``cond``'s first true value while the command runs (:func:`tests.helpers.wait_for`), watching the
        processes below it meanwhile."""
        return wait_for(lambda: (self.watch(), cond())[1], timeout, what, proc=self.proc, output=lambda: self.output)

    def ended_within(self, timeout: float) -> tuple[int, float]:
        """The command's exit status and how long it took to end (s); fails after ``timeout``."""
        t0 = time.monotonic()
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"train.py did not end within {timeout}s of the signal:\n{self.output[-4000:]}"
                                 ) from None
        return rc, time.monotonic() - t0

    def close(self) -> None:
        for pid in self.watch():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._out.close()


@pytest.fixture
def start(tmp_path: Path) -> tp.Iterator[tp.Callable[..., Cmd]]:
    cmds: list[Cmd] = []

    def _start(*args: str) -> Cmd:
        cmd = Cmd(tmp_path / f"out{len(cmds)}.txt", args, tmp_path)
        cmds.append(cmd)
        return cmd

    yield _start
    for c in cmds:
        c.close()


def pid_of(job_dir: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int((job_dir / "launch" / "pid").read_text())
    return None


def test_sigint_to_a_sweep_by_pid_ends_every_process_and_the_line_says_how(start, tmp_path: Path) -> None:
    """``kill -INT <launcher>`` of a 2-point local sweep (2 ranks each, so one runs and one is queued): the
    running job's ranks checkpoint and end, the queued one never starts, nothing of either is left, and the last
    line says exactly that, with status 130."""
    sweep = tmp_path / "S"
    cmd = start("-m", f"hydra.sweep.dir={sweep}", "interactive.nproc_per_node=2", "interactive.max_parallel=1",
                "step_scheduler.max_steps=5000", "step_scheduler.checkpoint_interval=1000", "optim.lr=1e-3,2e-3")
    head = cmd.until(lambda: pid_of(sweep / "0"), 120, "job 0's torchrun")
    cmd.until(lambda: (sweep / "0" / "metrics.jsonl").exists(), 180, "job 0's first steps")
    ranks = cmd.until(lambda: worker_pids(head) if len(worker_pids(head)) == 2 else None, 60, "job 0's ranks")
    job = cmd.watch() | {head, *ranks}
    cmd.proc.send_signal(signal.SIGINT)  # to the pid alone, not to a terminal's process group
    rc, took = cmd.ended_within(60)
    assert rc == 130, cmd.output[-4000:]
    assert not [p for p in job if alive(p)], "a process of the sweep outlived the stop"
    last = cmd.last_line()
    assert f"stopped: interactive job {head} (Ctrl-C: ended within the 30 s grace time), " in last, last
    assert f"interactive job {sweep / '1'} (Ctrl-C: never started)" in last, last
    assert not (sweep / "1" / "launch" / "pid").exists()
    assert "stop requested: checkpointed step" in (sweep / "0" / "train.log").read_text()


def test_a_hung_rank_is_killed_after_the_grace_time_on_sigterm_and_on_cancel(start, tmp_path: Path) -> None:
    """Rank 1 sleeps inside step 3, rank 0 waits for it in all_reduce. ``automodel-hydra cancel RUN`` and, in a
    second run, SIGTERM to ``train.py``: each ends every process of the job within ``interactive.kill_wait_s`` + a
    few seconds, and the last line names what had to be killed."""
    run = tmp_path / "R"
    args = (f"hydra.run.dir={run}", "recipe=tests.hang_recipe:main", f"+hang_dir={run}", "interactive.nproc_per_node=2",
            f"interactive.kill_wait_s={GRACE_S}")
    took = {}
    for how in ("cancel", "SIGTERM"):
        for mark in run.glob("hung.rank*"):
            mark.unlink()
        cmd = start(*args)
        head = cmd.until(lambda c=cmd: pid_of(run) if pid_of(run) in tree(c.proc.pid) else None, 120, "torchrun")
        cmd.until(lambda: len(list(run.glob("hung.rank*"))) == 2, 180, "the hang at step 3")
        time.sleep(1)  # rank 0 is in all_reduce, rank 1 in its sleep
        job = cmd.watch() | {head}
        assert len(worker_pids(head)) == 2
        if how == "cancel":
            cancel = subprocess.Popen([sys.executable, "-m", "automodel_hydra.cli", "cancel", str(run)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            cmd.until(lambda: (run / "launch" / "cancel.json").exists(), 60, "the cancel's record")
        else:
            cmd.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()  # the stop signal is on its way: the ranks get it next
        while [p for p in job if alive(p)] and time.monotonic() - t0 < GRACE_S + 30:
            time.sleep(0.1)
        took[how] = time.monotonic() - t0
        assert not [p for p in job if alive(p)], f"{how}: a process of the job outlived the stop"
        assert took[how] < GRACE_S + 10, took
        rc, _ = cmd.ended_within(30)
        assert rc == (130 if how == "cancel" else 128 + signal.SIGTERM), cmd.output[-4000:]
        if how == "cancel":
            assert cancel.wait(30) == 0, cancel.stdout.read() if cancel.stdout else ""
            print(cancel.stdout.read() if cancel.stdout else "")
        last = cmd.last_line()
        stopped = f"stopped: interactive job {head} ({'cancelled' if how == 'cancel' else 'SIGTERM'}: killed after " \
                  f"{GRACE_S} s: "
        assert last.startswith(stopped), last
        assert "rank 1 (pid " in last and "rank 0 (pid " in last and f"torchrun (pid {head})" in last, last
    print(f"seconds from the stop signal to no process of the job (grace {GRACE_S} s): {took}")
