"""Faults survived, end to end with real processes: a rank killed mid-run, the job killed while a
checkpoint is being written, SIGTERM to the torchrun group (``automodel-hydra cancel``) and to ``train.py`` itself.
The port already taken on this host is in test_interactive.py.

Each run is ``python train.py`` with 2 CPU ranks (gloo) on the bundled recipe; faults are real signals sent to real
processes found through ``launch/pid`` (the torchrun agent, leader of its own process group) and its children.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra.checkpoint import COMPLETE_MARKER, find_latest, is_complete
from tests.helpers import ROOT, metrics, wait_for, worker_pids

pytestmark = pytest.mark.slow


class Run:
    """``python train.py`` started in the background, output in a file; the fixture kills what is left."""

    def __init__(self, run_dir: Path, out: Path, args: tp.Sequence[str]) -> None:
        self.dir, self.out_path = run_dir, out
        self._out = open(out, "w")  # noqa: SIM115
        pid_file = run_dir / "launch" / "pid"
        self._stale_pid = pid_file.read_text().strip() if pid_file.is_file() else None  # an earlier run's
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", *args],
                                     cwd=run_dir.parent, env=env, stdout=self._out, stderr=subprocess.STDOUT)

    @property
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def torchrun_pid(self, timeout: float = 60) -> int:
        """The torchrun agent (``launch/pid``; the driver starts it in a new session, so it leads its group)."""
        pid_file = self.dir / "launch" / "pid"

        def fresh() -> int | None:
            text = pid_file.read_text().strip() if pid_file.is_file() else ""
            return int(text) if text and text != self._stale_pid and alive(int(text)) else None

        return wait_for(fresh, timeout, "launch/pid of this run", poll=0.05, proc=self.proc, output=lambda: self.output)

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"train.py did not end within {timeout}s:\n{self.output[-4000:]}") from None

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            os.killpg(int((self.dir / "launch" / "pid").read_text()), signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._out.close()


@pytest.fixture
def start(tmp_path: Path) -> tp.Iterator[tp.Callable[..., Run]]:
    runs: list[Run] = []

    def _start(*args: str, run_dir: Path | None = None) -> Run:
        run = Run(run_dir or tmp_path / "R", tmp_path / f"out{len(runs)}.txt", args)
        runs.append(run)
        return run

    yield _start
    for r in runs:
        r.kill()


def signal_all(pids: tp.Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def logged_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def restored_step(output: str) -> int:
    m = re.search(r"restored step (\d+) from", output)
    assert m, f"no resume in:\n{output[-3000:]}"
    return int(m.group(1))


TWO_RANKS = ("interactive.nproc_per_node=2", "step_scheduler.log_interval=1")


# ----------------------------------------------------------------------------------------------- a rank killed


def test_rank_killed_fails_the_job_cleanly(start) -> None:
    run = start(*TWO_RANKS, "step_scheduler.max_steps=5000", "step_scheduler.checkpoint_interval=1000")
    torchrun = run.torchrun_pid()
    wait_for(lambda: logged_steps(run.dir) >= 3, 120, "training steps", poll=0.05, proc=run.proc,
             output=lambda: run.output)
    ranks = worker_pids(torchrun)
    assert len(ranks) == 2, ranks
    os.kill(ranks[1], signal.SIGKILL)
    assert run.wait() != 0
    out = run.output
    assert "ended FAILED" in out and "torchrun exited with" in out  # the driver says so, with the job dir
    # the rank that left no record is named first, and classes the attempt: its peer's "Connection closed by peer"
    # (a comm error of rank 0's node) is only the echo of its end
    assert "ended FAILED: crash: rank 1 ended without a record (killed by a signal" in out.strip().splitlines()[-1]
    agent_log = next((run.dir / "launch").glob("agent.*.log")).read_text()
    assert "SIGKILL" in agent_log  # torchrun's failure summary names the killed rank, in its log
    assert not (run.dir / "result.json").exists()
    assert not any(alive(p) for p in [torchrun, *ranks]), "a rank or torchrun outlived the failed job"


def test_rank_killed_with_max_restarts_resumes_from_newest_checkpoint(start) -> None:
    run = start(*TWO_RANKS, "interactive.max_restarts=1", "step_scheduler.max_steps=150",
                "step_scheduler.checkpoint_interval=20")
    torchrun = run.torchrun_pid()
    wait_for(lambda: find_latest(run.dir / "checkpoints"), 120, "a first checkpoint", poll=0.05, proc=run.proc,
             output=lambda: run.output)
    wait_for(lambda: logged_steps(run.dir) >= 25, 60, "steps after the checkpoint", poll=0.05, proc=run.proc,
             output=lambda: run.output)
    ranks = worker_pids(torchrun)
    assert len(ranks) == 2, ranks
    os.kill(ranks[0], signal.SIGKILL)
    killed_at = logged_steps(run.dir)
    assert killed_at < 150, "the run ended before the kill; raise max_steps"
    assert run.wait() == 0, run.output[-4000:]
    out = run.output
    resumed = restored_step(out)
    assert 20 <= resumed <= killed_at and resumed % 20 == 0  # the newest complete checkpoint before the kill
    assert not alive(ranks[0]) and not alive(ranks[1])  # the group was restarted: new ranks finished the job
    assert [r["step"] for r in metrics(run.dir)] == list(range(1, 151)), "every step exactly once"
    assert (run.dir / "result.json").exists()


#: A torchrun worker whose rank 0 dies after attempt 0 and comes back last in attempt 1 (bootstrap.init_distributed).
RESTART_PROBE = """
import os, time
import torch, torch.distributed as dist
from automodel_hydra.bootstrap import init_distributed
attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
if attempt == 1 and rank == 0:
    time.sleep(5)  # the other rank rendezvouses first: it must not find attempt 0's keys (a dead rank's address)
with init_distributed(timeout_s=60):
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"attempt {attempt} rank {rank} sum {t.item():.0f}", flush=True)
    if attempt == 0 and rank == 0:
        os._exit(1)
    time.sleep(2)
"""


def test_restarted_group_does_not_read_the_previous_attempts_rendezvous(tmp_path: Path) -> None:
    """Deterministic form of the race behind the restart above: torchrun keeps one rendezvous store across restarts
    and env:// adds no per-attempt prefix, so a restarted rank could connect to a dead rank's gloo address."""
    (tmp_path / "probe.py").write_text(RESTART_PROBE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
                           "--max_restarts=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0",
                           str(tmp_path / "probe.py")], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "attempt 1 rank 0 sum 2" in out and "attempt 1 rank 1 sum 2" in out


# ----------------------------------------------------------------------------------------------- killed mid-save

#: ~10M parameters: each checkpoint (weights + Adam state, both ranks) is ~120 MB, written over a second or so,
#: which leaves a wide window to catch a save in progress; tiny batches keep the steps themselves short.
BIG = ("model.hidden_size=384", "model.num_layers=4", "model.intermediate_size=1536", "data.seq_len=16",
       "step_scheduler.local_batch_size=1", "checkpoint.keep_latest_k=2")


def _saving(ckpt: Path, after: int) -> Path | None:
    """A step dir past ``after`` that DCP has started writing (a shard exists) but that is not complete."""
    if not ckpt.is_dir():
        return None
    for d in ckpt.glob("step-*"):
        with contextlib.suppress(ValueError, OSError):
            if int(d.name[5:]) > after and any(d.glob("*.distcp")) and not (d / COMPLETE_MARKER).exists():
                return d
    return None


def test_killed_while_checkpointing_never_resumes_from_the_partial_checkpoint(start) -> None:
    """Deterministic kill inside a save: poll for a step dir with a shard but no completion marker, SIGSTOP the
    whole torchrun group (freezing every rank mid-write), check it is still incomplete, then SIGKILL it. When the
    save finished between the look and the stop, continue the group and catch the next save (every step saves)."""
    args = (*TWO_RANKS, *BIG, "step_scheduler.max_steps=8", "step_scheduler.checkpoint_interval=1")
    run = start(*args)
    torchrun = run.torchrun_pid()
    ckpt = run.dir / "checkpoints"
    first = wait_for(lambda: find_latest(ckpt), 180, "a first complete checkpoint", poll=0.01, proc=run.proc,
                     output=lambda: run.output)
    group = [torchrun, *worker_pids(torchrun)]  # torchrun starts each rank in a session of its own: signal each
    assert len(group) == 3, group
    partial = None
    while partial is None:
        d = wait_for(lambda: _saving(ckpt, int(first.name[5:])), 120, "a save in progress", poll=0.002,
                     proc=run.proc, output=lambda: run.output)
        signal_all(group, signal.SIGSTOP)
        if not (d / COMPLETE_MARKER).exists():
            partial = d
            signal_all(group, signal.SIGKILL)  # a crash: every process of the job dies at once, mid-write
        else:
            signal_all(group, signal.SIGCONT)
    assert run.wait() != 0
    wait_for(lambda: not any(alive(p) for p in group), 30, "the job's processes gone", poll=0.05,
             output=lambda: run.output)
    assert "ended FAILED" in run.output
    killed_step = int(partial.name[5:])
    assert not is_complete(partial) and not (partial / COMPLETE_MARKER).exists()
    latest = find_latest(ckpt)
    assert latest is not None and int(latest.name[5:]) < killed_step, "the pointer moved to a partial checkpoint"
    assert (ckpt / "latest").read_text().strip() == latest.name

    rerun = start(*args)
    assert rerun.wait() == 0, rerun.output[-4000:]
    assert restored_step(rerun.output) == int(latest.name[5:]) < killed_step
    assert [r["step"] for r in metrics(run.dir)] == list(range(1, 9)), "every step exactly once"
    assert is_complete(ckpt / "step-8") and (ckpt / "latest").read_text().strip() == "step-8"


# ----------------------------------------------------------------------------------------------- SIGTERM


def _assert_common_checkpoint(run: Run, ranks: list[int], resumed_from: int | None) -> int:
    """Both ranks caught the signal, stopped at one step and checkpointed it, and exited; returns that step."""
    out = run.output
    wait_for(lambda: not any(alive(p) for p in ranks), 60, "the ranks' exit", poll=0.05, output=lambda: run.output)
    for rank in (0, 1):
        assert re.search(rf"\[rank{rank}\].*caught SIGTERM", out), f"rank {rank} did not see the signal:\n{out}"
    stopped = re.findall(r"\[rank(\d)\].*stopped at step (\d+) on a signal", out)
    assert sorted(r for r, _ in stopped) == ["0", "1"], f"both ranks must stop on the signal:\n{out[-4000:]}"
    assert len({s for _, s in stopped}) == 1, f"ranks stopped at different steps: {stopped}"
    step = int(stopped[0][1])
    assert re.search(rf"stop requested: checkpointed step {step}\b", out)
    assert (run.dir / "checkpoints" / "latest").read_text().strip() == f"step-{step}"
    assert is_complete(run.dir / "checkpoints" / f"step-{step}")
    if resumed_from is not None:
        assert restored_step(out) == resumed_from
    steps = [r["step"] for r in metrics(run.dir)]
    assert steps == list(range(1, step + 1)), "every step once, up to the stop step and nothing after it"
    assert step % 1000 != 0  # a checkpoint made for the signal, not the interval's
    assert not (run.dir / "result.json").exists()
    return step


def _start_training(start: tp.Callable[..., Run], past: int) -> tuple[Run, int, list[int]]:
    run = start(*TWO_RANKS, "step_scheduler.max_steps=5000", "step_scheduler.checkpoint_interval=1000")
    torchrun = run.torchrun_pid()
    wait_for(lambda: logged_steps(run.dir) >= past + 5, 120, "training steps", poll=0.05, proc=run.proc,
             output=lambda: run.output)
    ranks = worker_pids(torchrun)
    assert len(ranks) == 2, ranks
    return run, torchrun, ranks


def test_stop_signals_checkpoint_every_rank_at_one_step_and_reruns_resume(start) -> None:
    """One run dir, four runs: SIGTERM to train.py; ``automodel-hydra cancel`` (SIGTERM to the torchrun group);
    SIGKILL of the torchrun agent alone; then a run that finishes. Each stop leaves one checkpoint that every rank
    took at the same step, the next run resumes from it, and metrics.jsonl ends with every step exactly once."""
    # 1. `kill <train.py>` (a closed terminal, a CI timeout): the driver stops its workers, it does not orphan them
    run, torchrun, ranks = _start_training(start, 0)
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 128 + signal.SIGTERM, run.output[-4000:]
    s1 = _assert_common_checkpoint(run, [torchrun, *ranks], None)

    # 2. automodel-hydra cancel RUN: SIGTERM to the torchrun group, which passes it to the ranks
    run, torchrun, ranks = _start_training(start, s1)
    cancel = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", "cancel", str(run.dir)],
                            capture_output=True, text=True, timeout=60)
    assert cancel.returncode == 0, cancel.stderr
    assert run.wait() == 130  # a stop, as after Ctrl-C
    last = run.output.strip().splitlines()[-1]  # one stop line: what was stopped, where the checkpoint is
    assert last.startswith("stopped: interactive job "), last
    # the cancel command writes how the job ended once it has; a driver that saw the end first says "(cancelled)"
    assert re.search(r"\(cancelled(: ended within the 30 s grace time)?\)", last), last
    assert f"newest checkpoint: {run.dir}/checkpoints/step-" in last, last
    assert not [line for line in run.output.splitlines() if line.startswith("error")]
    s2 = _assert_common_checkpoint(run, [torchrun, *ranks], s1)

    # 3. the torchrun agent killed outright (OOM killer, kill -9): the ranks, in sessions of their own, get SIGTERM
    #    from the kernel (worker.stop_when_parent_dies), checkpoint and exit instead of training on unattended
    run, torchrun, ranks = _start_training(start, s2)
    os.kill(torchrun, signal.SIGKILL)
    assert run.wait() != 0
    assert "ended FAILED" in run.output
    s3 = _assert_common_checkpoint(run, ranks, s2)

    # 4. a rerun finishes the job from there
    run = start(*TWO_RANKS, f"step_scheduler.max_steps={s3 + 10}", "step_scheduler.checkpoint_interval=1000")
    assert run.wait() == 0, run.output[-4000:]
    assert restored_step(run.output) == s3
    assert [r["step"] for r in metrics(run.dir)] == list(range(1, s3 + 11)), "every step exactly once"
    assert (run.dir / "result.json").exists()
