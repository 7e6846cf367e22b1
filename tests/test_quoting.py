"""Values stay data in every generated script : tested by RUNNING the scripts.

Run dirs, job names and env values hold spaces, both quotes, ``;``, ``$( )``, backticks, a backslash, ``$HOME`` and
newlines (``weird_path`` in conftest.py). Each comes in through ``python train.py`` as a user types it (Hydra's
quoted override syntax), and the generated shell is run by bash: the interactive ``launch/torchrun.sh`` really
trains; the Slurm sweep's array script and a job's own ``sbatch.sh`` run with stand-in ``srun``/``scontrol`` that
record argv and environment; SkyPilot's ``run`` runs with the ``SKYPILOT_*`` variables and a stand-in ``torchrun``.
A value that ran as code leaves ``MARK*`` files in the test's dir. (test_slurm_plan.py runs one weird single-job
script planned in-process; here it is end to end, through Hydra, as a job array.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import typing as tp
from pathlib import Path

import pytest
import yaml

from automodel_hydra.config import TrainConfig
from tests.helpers import ROOT, metrics

STANDINS = Path(__file__).parent / "standins"  # a stand-in `nsys` (tests/standins/nsys)
#: A job name (hydra.job.name) and an env value that would be code if unquoted, with newlines.
WEIRD_JOB = "train 'q' \"dq\" ; touch MARK4 $(touch MARK5) `touch MARK6`\ntouch MARK7"
WEIRD_VALUE = "line1\n; touch MARK8 $(touch MARK9) `touch MARKA` 'q' \"dq\" \\ $HOME"


def hq(value: str) -> str:
    """A value in Hydra's quoted-override syntax (``'...'``, ``\\'`` for a quote)."""
    assert "${" not in value, "OmegaConf would read ${...} as an interpolation"
    return "'" + value.replace("'", "\\'") + "'"


def train_py(*args: str, cwd: Path, env: tp.Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, **(env or {})}
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc


def assert_no_marks(*dirs: Path) -> None:
    marks = [str(p) for d in dirs for p in d.rglob("MARK*")] + [str(p) for p in Path.cwd().glob("MARK*")]
    assert not marks, f"a value ran as code: {marks}"


def write_exe(path: Path, text: str) -> None:
    path.write_text(textwrap.dedent(text).lstrip())
    path.chmod(0o755)


# ----------------------------------------------------------------------------------------------- interactive


@pytest.mark.slow
def test_interactive_trains_in_a_weird_dir_with_a_weird_job_name(weird_path: Path, tmp_path: Path) -> None:
    """torchrun.sh (with the nsys prefix and its PATH check) run by the driver: it trains, in the right dir."""
    run = weird_path / "run"
    train_py(f"hydra.run.dir={hq(str(run))}", f"hydra.job.name={hq(WEIRD_JOB)}", "interactive.nproc_per_node=1",
             "step_scheduler.max_steps=2", "step_scheduler.log_interval=1", "profile=nsys", cwd=tmp_path,
             env={"PATH": f"{STANDINS}:{os.environ['PATH']}"})
    assert_no_marks(tmp_path)
    assert sorted(p.name for p in weird_path.iterdir()) == ["run"]  # nothing split off the path
    assert [r["step"] for r in metrics(run)] == [1, 2]
    assert "done:" in (run / f"{WEIRD_JOB}.log").read_text()  # the worker's --log-file arrived whole
    assert len(list(run.glob(f"{WEIRD_JOB}_*_rank0_attempt0.nsys-rep"))) == 1  # nsys' --output too


# ----------------------------------------------------------------------------------------------- Slurm


@pytest.fixture
def slurm_standins(tmp_path: Path) -> Path:
    """``srun`` records its argv and environment as JSON (``$STANDIN_RECORD``); ``scontrol show hostnames``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_exe(bin_dir / "srun", f"""
        #!{sys.executable}
        import json, os, sys
        with open(os.environ["STANDIN_RECORD"], "w") as f:
            json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
        """)
    write_exe(bin_dir / "scontrol", """
        #!/bin/sh
        [ "$1 $2" = "show hostnames" ] && echo node1
        """)
    return bin_dir


def run_sbatch_script(script: Path, bin_dir: Path, cwd: Path, **env: str) -> dict[str, tp.Any]:
    record = cwd / "srun.json"
    record.unlink(missing_ok=True)
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(cwd), "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node1",
            "SLURM_NTASKS": "1", "STANDIN_RECORD": str(record)}
    proc = subprocess.run(["bash", str(script)], env={**base, **env}, cwd=cwd, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(record.read_text())


@pytest.mark.slow  # runs train.py or a script as a real process
def test_slurm_array_and_job_scripts_keep_weird_values_as_data(weird_path: Path, tmp_path: Path,
                                                               slurm_standins: Path) -> None:
    # sbatch reads `#SBATCH --output=<dir>/...` as one line: the sweep dir may not hold a newline (a clear error)
    # and no backslash: sbatch drops it from a filename pattern (refused with a clear error, test_slurm_plan.py)
    sweep = weird_path.with_name(weird_path.name.replace("\n", " ").replace("\\", "")) / "sweep"
    job_name = WEIRD_JOB.replace("\n", " ")  # hydra.job.name: in file names (log), never in a #SBATCH line
    train_py("-m", "launcher=slurm", f"hydra.sweep.dir={hq(str(sweep))}", f"hydra.job.name={hq(WEIRD_JOB)}",
             f"slurm.job_name={hq(job_name)}", f"++slurm.env_vars.NOTE={hq(WEIRD_VALUE)}", "slurm.ntasks_per_node=1",
             "seed=1,2", "dry_run=true", cwd=tmp_path)
    for script, task, job_dir in [(sweep / "launch" / "sbatch.sh", "1", sweep / "1"),
                                  (sweep / "0" / "launch" / "sbatch.sh", None, sweep / "0")]:
        env = {"SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": task} if task else {}
        seen = run_sbatch_script(script, slurm_standins, tmp_path, **env)
        assert seen["env"]["AUTOMODEL_JOB_DIR"] == str(job_dir)
        # $HOME is a reference, expanded in the job (bash's meaning, as AutoModel's `export K=V`); the rest is data
        assert seen["env"]["NOTE"] == WEIRD_VALUE.replace("$HOME", str(tmp_path))
        args = seen["argv"][seen["argv"].index("automodel_hydra.worker") + 1:]
        assert args == [str(job_dir / "launch" / "job.yaml"), "--log-file", str(job_dir / f"{WEIRD_JOB}.log"),
                        "--started-by", "srun", "--scheduler", "slurm"]
        assert (job_dir / "launch" / "job.yaml").is_file()
    assert_no_marks(tmp_path)


# ----------------------------------------------------------------------------------------------- SkyPilot


@pytest.mark.slow  # runs train.py or a script as a real process
def test_skypilot_run_keeps_weird_values_as_data(weird_path: Path, tmp_path: Path) -> None:
    # the mount point may not hold spaces (config rule); everything else a shell would trip on, it may (tabs split)
    mount = f"{tmp_path}/ck;'q'\"dq\"$(touch\tMARKB)`touch\tMARKC`$HOME"
    run_dir = weird_path / "run"
    train_py("launcher=skypilot", "skypilot.accelerators=null", "skypilot.setup=null",
             f"hydra.run.dir={hq(str(run_dir))}", f"hydra.job.name={hq(WEIRD_JOB)}",
             f"skypilot.checkpoint_mount={hq(mount)}", "skypilot.checkpoint_bucket=my-bucket",
             f"++skypilot.env_vars.NOTE={hq(WEIRD_VALUE)}", "profile=nsys",
             f"profile.nsys.extra_args=[{hq('--opt=' + WEIRD_VALUE)}]", "dry_run=true", cwd=tmp_path)
    task = yaml.safe_load((run_dir / "launch" / "sky_task.yaml").read_text())
    # "$HOME" in it is a shell reference: SkyPilot gets the value at launch, expanded as data (docs/skypilot.md)
    assert task["envs"]["NOTE"] is None
    node_cfg = yaml.safe_load((run_dir / "launch" / "job.sky.yaml").read_text())
    assert set(node_cfg) <= {f.name for f in dataclasses.fields(TrainConfig)}  # no keys injected by the job name

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # stand-in torchrun: records argv, leaves the result.json that node 0 prints at the end
    write_exe(bin_dir / "torchrun", f"""
        #!{sys.executable}
        import json, os, sys
        argv = sys.argv[1:]
        json.dump(argv, open(os.environ["STANDIN_RECORD"], "w"))
        out = os.path.dirname(argv[argv.index("--log-file") + 1])
        json.dump({{"loss": 1.0}}, open(os.path.join(out, "result.json"), "w"))
        """)
    write_exe(bin_dir / "nsys", "#!/bin/sh\nexit 0\n")  # the run's `command -v nsys` check, if any
    home, record = tmp_path / "home", tmp_path / "torchrun.json"
    home.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2\n",
           "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "0", "NOTE": WEIRD_VALUE, "STANDIN_RECORD": str(record)}
    proc = subprocess.run(["bash", "-c", task["run"]], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(record.read_text())
    # $HOME in a launcher field is the submitting shell's (a shell's meaning); the rest of the path stays data
    out = Path(mount.replace("$HOME", os.environ["HOME"])) / task["name"]
    assert out.is_dir() and (out / "result.json").is_file()  # mkdir -p and the result line used the exact path
    assert '"loss": 1.0' in proc.stdout
    assert argv[argv.index("--log-file") + 1] == f"{out}/{WEIRD_JOB}.log"
    assert f"--output={out}/{WEIRD_JOB}_%h_rank%q{{RANK}}_attempt%q{{TORCHELASTIC_RESTART_COUNT}}" in argv
    assert f"--opt={WEIRD_VALUE}" in argv
    assert argv[argv.index("automodel_hydra.worker") + 1] == f"{home}/automodel/{task['name']}/launch/job.yaml"
    assert_no_marks(tmp_path)


@pytest.mark.slurm
def test_sbatch_itself_reads_a_weird_job_name_and_log_dir_whole(slurm_cluster, weird_path: Path,
                                                                 tmp_path: Path) -> None:
    """``#SBATCH`` lines are read by sbatch, not bash: submit the planned script to the real cluster, held, and ask
    Slurm what it understood."""
    run = weird_path.with_name(weird_path.name.replace("\n", " ").replace("\\", "")) / "run"  # sbatch: no \\ in logs
    job_name = WEIRD_JOB.replace("\n", " \\ ")
    train_py("launcher=slurm", f"hydra.run.dir={hq(str(run))}", f"slurm.job_name={hq(job_name)}",
             "slurm.partition=debug", "slurm.gpus_per_node=0", "slurm.ntasks_per_node=1", "slurm.time=00:10:00",
             "dry_run=true", cwd=tmp_path)
    job_id = slurm_cluster.sbatch("--hold", str(run / "launch" / "sbatch.sh"))
    try:
        name = slurm_cluster.run("squeue", "-h", "-j", job_id, "-o", "%j").stdout.rstrip("\n")
        info = slurm_cluster.run("scontrol", "show", "job", job_id).stdout
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
    assert name == job_name
    stdout = next(line.strip()[len("StdOut="):] for line in info.splitlines() if line.strip().startswith("StdOut="))
    assert stdout.startswith(f"{run}/slurm/"), stdout
    assert_no_marks(tmp_path)
