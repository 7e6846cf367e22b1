"""torchrun's agent started while Hydra composes (automodel_hydra.prestart): the same run, with less waiting."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from automodel_hydra import prestart, stops
from tests.helpers import ROOT, worker_pids

RUN = ["step_scheduler.max_steps=1", "checkpoint.enabled=false", "interactive.nproc_per_node=2"]


@pytest.mark.parametrize("argv, local", [
    (["seed=3", "interactive.nproc_per_node=2"], True),
    (["--config-dir", "/d", "--config-name", "f"], True),
    (["launcher=interactive"], True),
    (["-m", "seed=1,2"], False),
    (["--multirun", "seed=1,2"], False),
    (["launcher=slurm"], False),
    (["hydra/launcher=submitit_slurm"], False),
    (["dry_run=true"], False),
    (["profile=nsys"], False),
    (["fault_tolerance.enabled=true"], False),
    (["--cfg", "job"], False),
    (["--help"], False),
])
def test_the_agent_is_started_only_for_what_looks_like_one_local_run(argv: list[str], local: bool) -> None:
    assert prestart.likely_local_run(argv) is local


def test_the_script_is_evaluated_by_bash_up_to_its_exec(tmp_path: Path) -> None:
    script = tmp_path / "torchrun.sh"
    work = tmp_path / "work dir"
    work.mkdir()
    script.write_text("set -euo pipefail\nexport A=1\nexport B=\"${B:-x} y\"\n"
                      f"cd '{work}'\nexec /bin/echo -m 'a b' \"127.0.0.1:${{PORT:-0}}\"\n")
    argv, env, cwd = prestart.planned_exec(script, {"PATH": os.environ["PATH"], "PORT": "29400"}, str(tmp_path))
    assert argv == ["/bin/echo", "-m", "a b", "127.0.0.1:29400"]
    assert (env["A"], env["B"], cwd) == ("1", "x y", str(work))
    script.write_text("exit 0\n")  # no exec: nothing the agent could run
    with pytest.raises(RuntimeError, match="without an exec"):
        prestart.planned_exec(script, {"PATH": os.environ["PATH"]}, None)


def test_only_keys_read_after_the_hand_over_may_differ() -> None:
    started = prestart.agent_env({"PATH": "/bin", "OMP_NUM_THREADS": "4"})
    planned = {**started, "OMP_NUM_THREADS": "1", "AUTOMODEL_RDZV_PORT": "29400", "SHLVL": "2", "_": "/py"}
    assert prestart.env_differences(started, planned) == []
    assert prestart.env_differences(started, {**planned, "PYTHONHASHSEED": "0", "NCCL_DEBUG": "INFO"}) == [
        "NCCL_DEBUG", "PYTHONHASHSEED"]


def _run_and_look(run: Path, env: dict[str, str]) -> tuple[list[str], list[tuple[dict[str, str], list[str], str]]]:
    """Start a 2-rank run in ``run``; while its ranks live, the head process's argv and each rank's environment,
    argv and working dir as the kernel started them (/proc), with ``run`` written as ``RUN``."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run}", *RUN], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pid_file, ranks, until = run / "launch" / "pid", [], time.monotonic() + 120
    while len(ranks) < 2 and time.monotonic() < until:
        time.sleep(0.05)
        with contextlib.suppress(OSError, ValueError):
            head = int(pid_file.read_text())
            ranks = worker_pids(head)
    assert len(ranks) == 2, proc.communicate()[0].decode()[-3000:]

    def seen(pid: int) -> tuple[dict[str, str], list[str], str]:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode().replace(str(run), "RUN")
        environ = dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().replace(str(run), "RUN").split("\0")
        return environ, argv, os.readlink(f"/proc/{pid}/cwd")

    head_argv = Path(f"/proc/{head}/cmdline").read_bytes().decode().split("\0")
    assert stops.describe(head) == f"torchrun (pid {head})"  # what a stop line calls it, either way
    looks = [seen(pid) for pid in ranks]
    out = proc.communicate(timeout=300)[0].decode()
    assert proc.returncode == 0, out[-3000:]
    return head_argv, looks


@pytest.mark.slow
def test_ranks_get_the_same_command_environment_and_dir_with_the_agent_started_early(tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if k != prestart.ENV}
    head_early, early = _run_and_look(tmp_path / "early", base)
    head_script, script = _run_and_look(tmp_path / "script", {**base, prestart.ENV: "0"})
    assert head_early[1] == prestart.__file__, head_early  # torchrun's agent is the interpreter started early
    assert head_script[1:3] == ["-m", "torch.distributed.run"], head_script  # bash ran torchrun.sh's exec
    # the OS-picked rendezvous port; torchrun's random run id, and the error file in a dir named after it
    per_run = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", prestart.ENV}  # and the switch
    for (env_a, argv_a, cwd_a), (env_b, argv_b, cwd_b) in zip(sorted(early, key=lambda s: s[0]["RANK"]),
                                                              sorted(script, key=lambda s: s[0]["RANK"])):
        assert {k: v for k, v in env_a.items() if k not in per_run} == {
            k: v for k, v in env_b.items() if k not in per_run}
        assert (argv_a, cwd_a) == (argv_b, cwd_b)


def _agents(mark: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if (proc.name.isdigit() and mark.encode() in (proc / "environ").read_bytes()
                    and b"prestart.py" in (proc / "cmdline").read_bytes()):
                found.append(int(proc.name))
    return found


def test_an_agent_nobody_takes_ends_with_its_driver(tmp_path: Path) -> None:
    # a refused value ends the command before anything starts; the agent started for it is gone with it
    mark = uuid.uuid4().hex
    env = {**os.environ, "AUTOMODEL_TEST_MARK": mark}
    env.pop(prestart.ENV, None)
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={tmp_path / 'bad'}", *RUN,
                           "step_scheduler.max_steps=-1"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and not (tmp_path / "bad" / "launch" / "pid").exists(), done.stdout + done.stderr
    assert _agents(mark) == []
    # a driver killed outright (SIGKILL, no exit handlers) takes its waiting agent with it (PR_SET_PDEATHSIG)
    driver = subprocess.Popen([sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={tmp_path / 'killed'}", *RUN],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    until = time.monotonic() + 30
    while not _agents(mark) and time.monotonic() < until:
        time.sleep(0.01)
    assert _agents(mark), "no agent was started"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    until = time.monotonic() + 10
    while _agents(mark) and time.monotonic() < until:
        time.sleep(0.05)
    assert _agents(mark) == []
