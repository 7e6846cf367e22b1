"""Slurm planning without a cluster: the recorded script, every option rule, and the script RUN by bash.

The generated sbatch script is executed by bash with stand-ins on PATH (``srun``, ``scontrol``, ``sbatch``,
``sacct``, ``squeue``), the way submitit's ``MockedSubprocess`` fakes the tools at the process boundary. The
stand-in ``srun`` records its argv and environment and, like srun, starts one "task" per rank, each of which reads
its place with the real bootstrap (``DistEnv.from_environ``)."""

from __future__ import annotations

import difflib
import json
import os
import shlex
import stat
import subprocess
import sys
import textwrap
import time
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import config
from automodel_hydra.automodel import kind as automodel_kind
from automodel_hydra.backends import slurm, slurm_plan
from automodel_hydra.backends.slurm import parse_slurm_time
from automodel_hydra.bootstrap import device_for, expand_hostlist, first_host
from automodel_hydra.plan import Batch, JobSpec, Plan, PreflightError, write_run_id
from automodel_hydra.schema import ConfigError
from automodel_hydra.states import JobState
from tests.helpers import ROOT, compose_cfg

GOLDEN = Path(__file__).parent / "golden" / "sbatch_2nodes.txt"
#: Set to record a missing golden file (the test still fails, so the new record is read before it is trusted).
RECORD_VAR = "AUTOMODEL_HYDRA_RECORD_GOLDEN"
JOB = JobSpec(job_dir=Path("/scratch/runs/2026-01-01/00-00-00"), job_name="train",
              project_root=Path("/src/automodel-hydra"))
GOLDEN_OVERRIDES = [
    "slurm.nodes=2", "slurm.ntasks_per_node=8", "slurm.gpus_per_node=8", "slurm.time=1-00:00:00",
    "slurm.account=my_account",
    "slurm.partition=batch", "slurm.qos=high", "slurm.constraint=h100", "slurm.exclude=gpu-b7", "slurm.mem=512G",
    "slurm.cpus_per_task=12", "slurm.container_image=nvcr.io/nvidia/nemo:dev", "slurm.hf_home=/lustre/hf",
    "slurm.nemo_mount=/opt/automodel", "slurm.extra_mounts=['/usr:/data']", "slurm.master_port=20000",
    "++slurm.env_vars.HF_TOKEN=${HF_TOKEN}", "++slurm.env_vars.NOTE='two words; $(id)'",
    "slurm.setup=['module load cuda/12.4']", "slurm.srun_args=['--mpi=pmix']", "++slurm.sbatch_args.mail-type=END",
    "slurm.signal_delay_s=600", "slurm.max_requeues=5",
]


def load(overrides: tp.Sequence[str], output_dir: Path | str = JOB.job_dir,
         **slurm_fields: tp.Any) -> config.TrainConfig:
    cfg = compose_cfg(["launcher=slurm", *overrides], output_dir)
    for key, value in slurm_fields.items():  # values a command line cannot carry (newlines, quotes)
        cfg.slurm[key] = value
    return config.load(cfg)


def script(overrides: tp.Sequence[str] = (), job: JobSpec = JOB, **fields: tp.Any) -> str:
    return slurm.Slurm().plan(load(overrides, job.job_dir, **fields), job).files["sbatch.sh"]


def directives(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH --"):
            key, _, value = line[len("#SBATCH --"):].partition("=")
            out[key] = value
    return out


# ----------------------------------------------------------------------------------------------- the recorded script


def test_golden_sbatch_2nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")
    text = script(GOLDEN_OVERRIDES)
    rel = f"{GOLDEN.relative_to(ROOT)}"
    if not GOLDEN.exists():  # a missing record fails; it is written only when asked for
        if os.environ.get(RECORD_VAR):
            GOLDEN.write_text(text)
            pytest.fail(f"recorded {rel}: read it, then rerun without {RECORD_VAR}")
        pytest.fail(f"{rel} is missing. Record it with {RECORD_VAR}=1 pytest {Path(__file__).relative_to(ROOT)} "
                    "-k golden_sbatch, read it, and commit it")
    expected = GOLDEN.read_text()
    if text != expected:
        diff = "\n".join(difflib.unified_diff(expected.splitlines(), text.splitlines(), "recorded", "planned",
                                              lineterm=""))
        pytest.fail(f"the planned script differs from {rel}:\n{diff}\n\nIf the change is intended, regenerate "
                    f"the record: rm {rel} && {RECORD_VAR}=1 pytest {Path(__file__).relative_to(ROOT)} "
                    "-k golden_sbatch")


def test_golden_options() -> None:
    d = directives(GOLDEN.read_text())
    assert d["time"] == "1440" and d["nodes"] == "2" and d["ntasks-per-node"] == "8"
    assert d["gpus-per-node"] == "8"  # given; left out, no GPU is requested (tests/test_automodel_rules.py)
    assert d["signal"] == "USR2@600" and "requeue" in d and d["mail-type"] == "END"
    assert "None" not in GOLDEN.read_text() and "wckey" not in d


# ----------------------------------------------------------------------------------------------- option rules


def test_unset_options_are_left_out() -> None:
    text = script(["slurm.gpus_per_node=0", "slurm.max_requeues=0"])
    d = directives(text)
    for key in ("account", "partition", "qos", "constraint", "exclude", "mem", "cpus-per-task", "gpus-per-node",
                "requeue", "wckey"):
        assert key not in d, key
    assert "None" not in text and "=null" not in text
    assert "no-requeue" in d  # else the cluster's JobRequeue=1 default requeues it after a node failure
    assert "export AUTOMODEL_MAX_REQUEUES=0" in text


@pytest.mark.parametrize("value, minutes", [("1-00:00:00", 1440), ("90", 90), ("00:30:30", 31), ("5:30", 6),
                                            ("1-2", 1560), ("1-02:03", 1563)])
def test_time_forms(value: str, minutes: int) -> None:
    assert parse_slurm_time(value) == minutes
    assert directives(script([f"slurm.time='{value}'", "slurm.signal_delay_s=60"]))["time"] == str(minutes)


@pytest.mark.parametrize("value", ["0", "abc", "00:00:00", "1:2:3:4", "UNLIMITED"])
def test_bad_times_are_rejected(value: str) -> None:
    with pytest.raises(ConfigError, match="slurm.time"):
        load([f"slurm.time='{value}'"])


def test_time_shorter_than_twice_the_margin_signals_at_half_the_limit() -> None:
    text = script(["slurm.time=5", "slurm.signal_delay_s=300"])
    assert directives(text)["signal"] == "USR2@150"
    assert "checkpoint margin 150s" in text


def test_container_flags_and_mounts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/host/venv/bin/python")
    text = script(["slurm.container_image=nvcr.io/nvidia/nemo:dev", "slurm.hf_home=/lustre/hf",
                   "slurm.nemo_mount=/opt/automodel", "slurm.extra_mounts=['/usr:/data',{source: /etc, dest: /cfg}]"])
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert "--container-image=nvcr.io/nvidia/nemo:dev" in srun
    mounts = srun.split("--container-mounts=")[1].split()[0].split(",")
    assert mounts == ['"$HF_HOME:$HF_HOME"', "/src/automodel-hydra:/opt/automodel", "/usr:/data", "/etc:/cfg",
                      f"{JOB.job_dir}:{JOB.job_dir}"]
    assert f"--container-workdir={JOB.job_dir}" in srun
    assert " python -u -m automodel_hydra.worker" in srun and "/host/venv" not in srun
    assert "export PYTHONPATH=/opt/automodel\n" in text and "export HF_HOME=/lustre/hf" in text
    assert "/usr" in text.split("# slurm.extra_mounts")[0]  # sources checked again on the node


def test_no_container_runs_this_python_on_this_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/host/venv/bin/python")
    text = script()
    assert "--container" not in text
    assert "export PYTHONPATH=/src/automodel-hydra${PYTHONPATH:+:$PYTHONPATH}" in text
    assert "/host/venv/bin/python -u -m automodel_hydra.worker" in text


def test_mount_sources_must_exist_on_the_submitting_host(tmp_path: Path) -> None:
    cfg = load([f"slurm.extra_mounts=['{tmp_path}/missing:/data']", "slurm.container_image=img"])
    with pytest.raises(ConfigError, match=r"slurm.extra_mounts\[0\].source"):
        slurm.Slurm().preflight([cfg])


def test_sbatch_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    backend = slurm.Slurm()
    (batch,) = backend.batches([backend.plan(load([], tmp_path), JobSpec(tmp_path, "train"))], None)
    with pytest.raises(RuntimeError, match="sbatch is not on PATH.*module load slurm.*slurm-client"):
        backend.submit(batch)


def test_env_refs_are_never_expanded_into_the_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_SECRET_value")
    text = script(["++slurm.env_vars.HF_TOKEN=${HF_TOKEN}", "++slurm.env_vars.W=${oc.env:WANDB_API_KEY}"])
    assert "hf_SECRET_value" not in text
    assert 'export HF_TOKEN="${HF_TOKEN}"' in text and 'export W="${WANDB_API_KEY}"' in text


def test_nsys_wraps_each_rank() -> None:
    text = script(["profile=nsys"])
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert " nsys profile " in srun and srun.index("nsys profile") < srun.index("automodel_hydra.worker")
    # one report per rank and per attempt: a requeued job's reports never replace the first attempt's
    assert '--output="$AUTOMODEL_JOB_DIR"\'/train_%h_rank%q{SLURM_PROCID}_requeue%q{AUTOMODEL_REQUEUE}\'' in srun
    assert "command -v nsys" in text  # a clear error on a node without nsys


def test_newline_in_an_sbatch_option_is_refused() -> None:
    with pytest.raises(ValueError, match="one option per line"):
        script(job=JobSpec(Path("/runs/a\nb"), "train"))
    with pytest.raises(ValueError, match="job-name"):
        script(job_name="x\nrm -rf /")


# ----------------------------------------------------------------------------------------------- the script, run


def _write_exe(path: Path, text: str) -> None:
    path.write_text(textwrap.dedent(text).lstrip())
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def standins(tmp_path: Path) -> Path:
    """A bin dir with stand-in ``srun`` (records argv, env and each task's DistEnv) and ``scontrol``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _write_exe(bin_dir / "srun", f"""
        #!{sys.executable}
        import json, os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from automodel_hydra.bootstrap import DistEnv
        n, per_node = int(os.environ["SLURM_NTASKS"]), int(os.environ["SLURM_NTASKS_PER_NODE"])
        tasks = []
        for rank in range(n):  # what each task sees: the batch step's environment plus its place
            env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank % per_node),
                       SLURM_NODEID=str(rank // per_node))
            d = DistEnv.from_environ(env)
            tasks.append([d.rank, d.world_size, d.master_addr, d.master_port])
        with open(os.environ["STANDIN_RECORD"], "w") as f:
            json.dump({{"argv": sys.argv[1:], "env": dict(os.environ), "tasks": tasks}}, f)
        """)
    _write_exe(bin_dir / "scontrol", f"""
        #!{sys.executable}
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from automodel_hydra.bootstrap import expand_hostlist
        assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
        print("\\n".join(expand_hostlist(sys.argv[3])))
        """)
    return bin_dir


def run_script(text: str, standins: Path, tmp_path: Path, job_id: int = 4242, nodelist: str = "node[1-2]",
               nodes: int = 2, per_node: int = 2, **env: str) -> dict[str, tp.Any]:
    """Run the script with bash as the batch step of job ``job_id``; returns what the stand-in srun saw."""
    path = tmp_path / "sbatch.sh"
    path.write_text(text)
    record = tmp_path / f"srun-{job_id}.json"
    base = {"PATH": f"{standins}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": str(job_id),
            "SLURM_JOB_NODELIST": nodelist, "SLURM_NTASKS": str(nodes * per_node),
            "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_JOB_NUM_NODES": str(nodes),
            "STANDIN_RECORD": str(record)}
    proc = subprocess.run(["bash", str(path)], env={**base, **env}, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(record.read_text())
    out["stderr"] = proc.stderr
    return out


def worker_args(argv: list[str]) -> list[str]:
    return argv[argv.index("automodel_hydra.worker") + 1:]


def test_field_nodelist_master_is_the_plain_host_first(standins: Path, tmp_path: Path) -> None:
    nodelist = "gpu-b7,gpu-a[001-003,010]"
    assert first_host(nodelist) == "gpu-b7"
    assert expand_hostlist(nodelist) == ["gpu-b7", "gpu-a001", "gpu-a002", "gpu-a003", "gpu-a010"]
    seen = run_script(script(["slurm.nodes=5", "slurm.ntasks_per_node=1"]), standins, tmp_path,
                      nodelist=nodelist, nodes=5, per_node=1)
    assert seen["env"]["MASTER_ADDR"] == "gpu-b7"
    assert {t[2] for t in seen["tasks"]} == {"gpu-b7"} and [t[1] for t in seen["tasks"]] == [5] * 5


def test_port_differs_between_jobs_and_agrees_within_one(standins: Path, tmp_path: Path) -> None:
    text = script(["slurm.nodes=2", "slurm.ntasks_per_node=4"])
    ports = {}
    for job_id in (1001, 1002):
        seen = run_script(text, standins, tmp_path, job_id=job_id, per_node=4)
        assert [t[0] for t in seen["tasks"]] == list(range(8)) and {t[1] for t in seen["tasks"]} == {8}
        assert len({t[3] for t in seen["tasks"]}) == 1, "every task of a job agrees on its port"
        ports[job_id] = seen["tasks"][0][3]
        assert f"rendezvous at node1:{ports[job_id]}" in seen["stderr"]  # the chosen port is logged
    assert ports == {1001: 13742 + 1, 1002: 13742 + 2}


@pytest.mark.parametrize("container", [True, False])
def test_hf_home_under_home_is_the_nodes_home_exported_to_the_ranks_and_mounted(standins: Path, tmp_path: Path,
                                                                               container: bool) -> None:
    """AutoModel's default ``hf_home: ~/.cache/huggingface``: the job user's home where the job runs (not the
    submitting host's), exported as HF_HOME, created by the job, and mounted at that path in a container."""
    image = ["slurm.container_image=nvcr.io/nvidia/nemo:dev"] if container else []
    cfg = load([*image, "slurm.hf_home='~/.cache/huggingface'"], tmp_path / "run")
    slurm.Slurm().preflight([cfg])  # a cache dir that does not exist yet is no reason to refuse
    home = tmp_path / "node-home"
    text = slurm.Slurm().plan(cfg, JOB).files["sbatch.sh"]
    seen = run_script(text, standins, tmp_path, HOME=str(home))
    assert seen["env"]["HF_HOME"] == f"{home}/.cache/huggingface"
    mounts = [a for a in seen["argv"] if a.startswith("--container-mounts=")]
    if container:
        assert (home / ".cache" / "huggingface").is_dir()
        assert mounts[0].split("=", 1)[1].split(",")[0] == f"{home}/.cache/huggingface:{home}/.cache/huggingface"
    else:
        assert mounts == []


def test_hf_home_is_mounted_where_env_vars_moved_it(standins: Path, tmp_path: Path) -> None:
    text = script(["slurm.container_image=img", "slurm.hf_home=/lustre/hf",
                   f"++slurm.env_vars.HF_HOME={tmp_path}/hf"])
    seen = run_script(text, standins, tmp_path)
    assert seen["env"]["HF_HOME"] == f"{tmp_path}/hf" and (tmp_path / "hf").is_dir()
    assert f"--container-mounts={tmp_path}/hf:{tmp_path}/hf," in " ".join(seen["argv"])


@pytest.mark.parametrize("value, why", [("hf", "absolute path"), ("/lustre/a:b", "without ','"),
                                        ("~user/hf", "absolute path")])
def test_hf_home_that_cannot_be_exported_or_mounted_is_refused(value: str, why: str) -> None:
    with pytest.raises(ConfigError, match=rf"slurm.hf_home.*{why}"):
        load([f"slurm.hf_home='{value}'"])


def _automodel_plan(tmp_path: Path, **slurm_fields: tp.Any) -> Plan[slurm.Request]:
    """A job of a recipe other than the bundled one (an AutoModel file's ``slurm:`` section)."""
    cfg = config.load({"output_dir": str(tmp_path),
                       "recipe": "nemo_automodel.recipes.llm.train_ft.TrainFinetuneRecipeForNextTokenPrediction",
                       "slurm": {"ntasks_per_node": 2, **slurm_fields}})
    return slurm.Slurm().plan(cfg, JobSpec(tmp_path, "train"))


def test_an_automodel_recipe_gets_automodels_template_settings(standins: Path, tmp_path: Path) -> None:
    """AutoModel's sbatch template fixed --mail-type=FAIL and three variables; its files keep them (each can be
    changed), the bundled recipe does without (docs/slurm.md, "AutoModel's template")."""
    text = _automodel_plan(tmp_path).files["sbatch.sh"]
    assert directives(text)["mail-type"] == "FAIL"
    env = run_script(text, standins, tmp_path, nodes=1)["env"]
    assert (env["CUDA_DEVICE_MAX_CONNECTIONS"], env["TORCH_NCCL_AVOID_RECORD_STREAMS"],
            env["NCCL_NVLS_ENABLE"]) == ("1", "1", "0")
    assert "--mpi=pmix" not in text  # srun's MPI plugin stays the cluster's default (MpiDefault)
    # the submitting shell's value and an env_vars entry win; sbatch_args drop or change the mail
    changed = _automodel_plan(tmp_path, env_vars={"NCCL_NVLS_ENABLE": "1"},
                              sbatch_args={"mail-type": False}).files["sbatch.sh"]
    assert "mail-type" not in directives(changed)
    env = run_script(changed, standins, tmp_path, nodes=1, CUDA_DEVICE_MAX_CONNECTIONS="8")["env"]
    assert (env["CUDA_DEVICE_MAX_CONNECTIONS"], env["NCCL_NVLS_ENABLE"]) == ("8", "1")
    bundled = script()
    assert "mail-type" not in directives(bundled)
    assert not [v for v in automodel_kind.TASK_ENV if v in bundled]


def test_port_taken_on_the_master_moves_up(standins: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        if taken > 64000 or taken < 2000:
            pytest.skip("ephemeral port out of the range this check needs")
        base = taken - 7  # job 7 of 1000 lands on the taken port
        seen = run_script(script([f"slurm.master_port={base}"]), standins, tmp_path, job_id=7,
                          SLURMD_NODENAME="node1")
    assert seen["env"]["MASTER_PORT"] == str(taken + 1000)


@pytest.mark.parametrize("local_rank, gpus, device", [(k, 8, f"cuda:{k}") for k in range(8)] + [(3, 1, "cuda:0")])
def test_one_cuda_device_per_local_rank(local_rank: int, gpus: int, device: str) -> None:
    assert device_for(local_rank, gpus) == device


WEIRD = "we ird 'q' \"dq\" ; echo INJECTED > MARK1 $(touch MARK2) `touch MARK3` \\ end"


def test_a_backslash_in_the_run_dir_is_refused_naming_the_log_option(tmp_path: Path) -> None:
    """sbatch drops a backslash from a filename pattern (sbatch(1)): the log would land elsewhere."""
    job = JobSpec(tmp_path / "a\\b" / "job", job_name="train")
    with pytest.raises(ValueError, match="--output=.*cannot contain a backslash"):
        script([], job=job)


def test_weird_values_stay_data_when_bash_runs_the_script(standins: Path, tmp_path: Path) -> None:
    job = JobSpec(tmp_path / WEIRD.replace("\\", "") / "job", job_name=f"train {WEIRD}")
    env_value = f"line1\n{WEIRD}\n$HOME ${{HOME}}"
    text = script(["profile=nsys", "slurm.nodes=1", "slurm.ntasks_per_node=2"], job=job, job_name=f"llm {WEIRD}",
                  env_vars={"WEIRD": env_value}, srun_args=[f"--comment={WEIRD}"])
    (tmp_path / "bin" / "nsys").write_text("")  # the node-side nsys check only needs it on PATH
    (tmp_path / "bin" / "nsys").chmod(0o755)
    seen = run_script(text, standins, tmp_path, nodes=1)
    # $HOME and ${HOME} are references, expanded where the job runs (a shell's meaning); the rest stays data
    assert seen["env"]["WEIRD"] == env_value.replace("$HOME ${HOME}", f"{seen['env']['HOME']} {seen['env']['HOME']}")
    assert seen["env"]["AUTOMODEL_JOB_DIR"] == str(job.job_dir)
    args = worker_args(seen["argv"])
    assert args == [str(job.job_file), "--log-file", str(job.log_file), "--started-by", "srun", "--scheduler", "slurm"]
    assert f"--comment={WEIRD}" in seen["argv"]
    report = f"{job.job_dir}/{job.job_name}_%h_rank%q{{SLURM_PROCID}}_requeue%q{{AUTOMODEL_REQUEUE}}"
    assert f"--output={report}" in seen["argv"]
    assert not list(tmp_path.glob("MARK*")) and not list(Path.cwd().glob("MARK*")), "a value ran as code"
    assert directives(text)["job-name"].startswith('"llm we ird')  # sbatch parses quoted #SBATCH values


# ----------------------------------------------------------------------------------------------- sweeps: job arrays


def sweep_plans(tmp_path: Path, n: int, overrides: tp.Sequence[str] = ()) -> list[Plan[slurm.Request]]:
    plans = []
    for i in range(n):
        job = JobSpec(tmp_path / "sweep" / str(i), "train", overrides=(f"optim.lr={i}",), job_num=i)
        plans.append(slurm.Slurm().plan(load(["slurm.array_parallelism=2", *overrides], job.job_dir), job))
    return plans


def sweep_batches(plans: tp.Sequence[Plan[slurm.Request]], sweep_dir: Path,
                  max_array_size: int = 1001) -> tuple[slurm.Slurm, list[Batch[slurm.Request]]]:
    backend = slurm.Slurm()
    return backend, backend.batches(plans, sweep_dir, slurm.Facts(max_array_size))


def write(batch: Batch[tp.Any]) -> None:
    """What the driver does with a batch before submitting it."""
    for path, text in batch.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_sweep_is_one_array_and_task_i_runs_job_i(standins: Path, tmp_path: Path) -> None:
    plans = sweep_plans(tmp_path, 3)
    assert len({p.group_key for p in plans}) == 1
    _, (batch,) = sweep_batches(plans, tmp_path / "sweep")
    text = batch.files[tmp_path / "sweep" / "launch" / "sbatch.sh"]
    assert directives(text)["array"] == "0-2%2"
    assert directives(text)["output"] == f"{tmp_path}/sweep/slurm/%A_%a_0_log.out"
    for i in range(3):
        seen = run_script(text, standins, tmp_path, job_id=500 + i, nodes=1, SLURM_ARRAY_TASK_ID=str(i))
        assert worker_args(seen["argv"])[0] == str(plans[i].job.job_file)
        assert batch.files[plans[i].job.launch_dir / "sbatch.sh"] == plans[i].files["sbatch.sh"]  # its own script


def test_sweep_larger_than_max_array_size_is_split(tmp_path: Path) -> None:
    _, batches = sweep_batches(sweep_plans(tmp_path, 5), tmp_path / "sweep", max_array_size=2)
    scripts = [{p.name: t for p, t in b.files.items() if p.parent == tmp_path / "sweep" / "launch"} for b in batches]
    assert [list(s) for s in scripts] == [["sbatch.sh"], ["sbatch_2.sh"], ["sbatch_4.sh"]]
    assert [directives(t)["array"] for s in scripts for t in s.values()] == ["0-1%2", "0-1%2", "0%1"]


def test_a_resumed_sweeps_array_holds_just_the_members_that_run_again_as_their_own_task_ids(
        fake_slurm: Path, standins: Path) -> None:
    """A resume submits the members 2 and 5 of a sweep: one array ``--array=2,5``, task N runs job N's dir and
    is named ``<id>_N`` (so sacct's ``42_5`` is job 5, as in the first launch); past MaxArraySize, 0..n-1."""
    plans = [p for p in sweep_plans(fake_slurm, 6) if p.job.job_num in (2, 5)]
    backend, (batch,) = sweep_batches(plans, fake_slurm / "sweep")
    text = batch.files[fake_slurm / "sweep" / "launch" / "sbatch_2.sh"]
    assert directives(text)["array"] == "2,5%2"
    seen = run_script(text, standins, fake_slurm, job_id=600, nodes=1, SLURM_ARRAY_TASK_ID="5")
    assert worker_args(seen["argv"])[0] == str(plans[1].job.job_file)
    write(batch)
    assert [s.ids for s in backend.submit(batch)] == [["42_2"], ["42_5"]]
    _, (split,) = sweep_batches(plans, fake_slurm / "sweep", max_array_size=5)
    assert directives(split.files[fake_slurm / "sweep" / "launch" / "sbatch_2.sh"])["array"] == "0-1%2"


def test_different_slurm_options_make_different_arrays(tmp_path: Path) -> None:
    a = sweep_plans(tmp_path / "a", 1)[0]
    b = sweep_plans(tmp_path / "b", 1, ["slurm.nodes=2"])[0]
    assert a.group_key != b.group_key


def test_max_array_size_is_read_from_the_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _write_exe(tmp_path / "scontrol", "#!/bin/sh\necho 'MaxArraySize            = 40'\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    backend = slurm.Slurm()
    assert backend.preflight([]).max_array_size == 40  # (the real sinfo may answer the partitions too)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert backend.preflight([]).max_array_size == slurm.DEFAULT_MAX_ARRAY_SIZE


# ----------------------------------------------------------------------------------------------- submit, status


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Stand-in sbatch (keeps a copy of what it was given, answers job 42 as ``--parsable`` does), sacct
    (accounting off) and squeue (one line per array task, as ``squeue --array`` prints)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    _write_exe(bin_dir / "sbatch", f'#!/bin/sh\nfor a; do f=$a; done\ncp "$f" {tmp_path}/submitted.sh\necho 42\n')
    _write_exe(bin_dir / "sacct", "#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\nexit 1\n")
    _write_exe(bin_dir / "squeue",
               "#!/bin/sh\nprintf '42_0|COMPLETED|None\\n42_1|PENDING|Priority\\n42_2|PENDING|Priority\\n'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path


def test_submit_runs_the_array_script_planning_wrote_and_writes_nothing(fake_slurm: Path) -> None:
    plans = sweep_plans(fake_slurm, 3)
    backend, (batch,) = sweep_batches(plans, fake_slurm / "sweep")
    write(batch)
    before = {p: p.read_text() for p in batch.files}
    subs = backend.submit(batch)
    assert (fake_slurm / "submitted.sh").read_text() == batch.files[fake_slurm / "sweep" / "launch" / "sbatch.sh"]
    assert {p: p.read_text() for p in batch.files} == before
    assert [s.ids for s in subs] == [["42_0"], ["42_1"], ["42_2"]]
    assert subs[1].log_path == f"{fake_slurm}/sweep/slurm/42_1_0_log.out"
    assert (fake_slurm / "sweep" / "slurm").is_dir()  # sbatch does not create its log dir
    infos = backend.states([s.ref for s in subs])
    assert [i.state for i in infos] == [JobState.COMPLETED, JobState.PENDING, JobState.PENDING]
    assert infos[1].reason == "Priority" and infos[0].reason == ""


@pytest.mark.parametrize("said, hint", [
    ("sbatch: error: Unable to contact slurm controller (connect failure)", "login node"),
    ("sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host", "does not resolve"),
    ("sbatch: fatal: Could not establish a configuration source", "set SLURM_CONF"),
])
def test_no_reachable_cluster_says_what_is_missing(fake_slurm: Path, said: str, hint: str) -> None:
    _write_exe(fake_slurm / "fakebin" / "sbatch", f"#!/bin/sh\necho '{said}' >&2\nexit 1\n")
    backend = slurm.Slurm()
    (batch,) = backend.batches([backend.plan(load([], fake_slurm / "r"), JobSpec(fake_slurm / "r", "train"))], None)
    with pytest.raises(RuntimeError, match=hint):
        backend.submit(batch)


@pytest.mark.parametrize("printed, listed, ids", [
    ("sbatch wrapper: charged to account 'test'\n42\n", True, ["42"]),  # a site wrapper's banner before the id
    ("Submitted batch job 42\n", True, ["42"]),  # a wrapper that drops --parsable
    ("queued.\n", False, []),  # neither the output nor squeue says which job: recorded without an id
])
def test_a_job_sbatch_queued_is_recorded_whatever_sbatch_printed(fake_slurm: Path, printed: str, listed: bool,
                                                                 ids: list[str]) -> None:
    """sbatch exited 0, so the job is queued: its id is what ``--parsable`` printed, else the job squeue lists for
    the script; a submission is returned (and recorded) in every case, and a job without an id says so."""
    run = fake_slurm / "run"
    script = run / "launch" / "sbatch.sh"
    _write_exe(fake_slurm / "fakebin" / "sbatch", f"#!/bin/sh\nprintf %s {shlex.quote(printed)}\n")
    _write_exe(fake_slurm / "fakebin" / "squeue", "#!/bin/sh\ncase \"$*\" in *%o*) " +
               (f"printf '41|/elsewhere/sbatch.sh\\n42|{script}\\n' ;; " if listed else ";; ") +
               "*) printf '42|RUNNING|None\\n' ;; esac\n")
    backend = slurm.Slurm()
    (batch,) = backend.batches([backend.plan(load([], run), JobSpec(run, "train"))], None)
    write(batch)
    (sub,) = backend.submit(batch)
    assert sub.ids == ids and sub.record()["job_ids"] == ids
    (info,) = backend.states([sub.ref])
    assert info.state is (JobState.RUNNING if ids else JobState.UNKNOWN)
    if not ids:
        assert "without saying its id" in info.reason and sub.log_path is None
        (result,) = backend.wait([sub])
        assert result.state is JobState.UNKNOWN and "squeue --me" in (result.error or "")


def test_slurm_conf_that_is_no_file_fails_preflight_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "nope.conf"))
    with pytest.raises(PreflightError, match="SLURM_CONF=.*nope.conf is not a file"):
        slurm.Slurm().preflight([load([], tmp_path)])


def test_state_is_unknown_when_no_tool_knows_the_job(fake_slurm: Path) -> None:
    _write_exe(fake_slurm / "fakebin" / "squeue", "#!/bin/sh\nexit 0\n")
    assert slurm.Slurm().states([slurm.SlurmRef("77")])[0].state is JobState.UNKNOWN


@pytest.mark.parametrize("raw, state", [("CANCELLED by 0", "CANCELLED"), ("OUT_OF_MEMORY", "OUT_OF_MEMORY"),
                                        ("REQUEUED", "PENDING"), ("COMPLETING", "RUNNING"), ("", "UNKNOWN"),
                                        ("TIMEOUT", "TIMEOUT"), ("RUNNING", "RUNNING"), ("PREEMPTED", "PREEMPTED"),
                                        ("NODE_FAIL", "NODE_FAIL"), ("DEADLINE", "DEADLINE")])
def test_states_are_slurms_own_names(raw: str, state: str) -> None:
    assert JobState.from_slurm(raw).value == state


class _Clock:
    """``time.time`` and ``time.sleep`` for the Slurm backend's wait loop: a sleep moves this clock on instead of
    waiting, so the polls and their results are the same without their seconds."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize("state", ["PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "TIMEOUT",
                                   "CANCELLED", "FAILED", "COMPLETED"])
def test_every_documented_final_state_ends_the_wait(fake_slurm: Path, state: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _write_exe(fake_slurm / "fakebin" / "squeue", f"#!/bin/sh\nprintf '42|{state}|None\\n'\n")
    backend = slurm.Slurm()
    (batch,) = backend.batches([backend.plan(load([], fake_slurm / "run"), JobSpec(fake_slurm / "run", "train"))],
                               None)
    (sub,) = backend.submit(batch)
    monkeypatch.setattr(slurm, "time", _Clock())  # the first poll comes 2 s after the submit: on this clock
    (result,) = backend.wait([sub], max_poll_s=0.1)
    assert result.state is (JobState.FAILED if state == "COMPLETED" else JobState(state))  # no result.json


def test_single_job_reference(fake_slurm: Path) -> None:
    backend = slurm.Slurm()
    plan = backend.plan(load([], fake_slurm / "run"), JobSpec(fake_slurm / "run", "train"))
    (sub,) = backend.submit(backend.batches([plan], None)[0])
    assert sub.ids == ["42"] and backend.ref_from_record(sub.record()).job_id == "42"
    assert sub.log_path == f"{fake_slurm}/run/slurm/42_0_log.out"
    assert plan.wait is False  # a single run returns at once unless slurm.wait


@pytest.mark.parametrize("overrides, name", [
    ([], "llm_finetune"), (["slurm.job_name=squad ft"], "squad ft"),
    (["++slurm.sbatch_args.job-name=from_args"], "from_args"),  # sbatch_args come last: their name wins
])
def test_recorded_job_name_is_the_one_sbatch_was_given(fake_slurm: Path, overrides: list[str], name: str) -> None:
    backend = slurm.Slurm()
    single = backend.plan(load(overrides, fake_slurm / "run"), JobSpec(fake_slurm / "run", "train"))
    (batch,) = backend.batches([single], None)
    write(batch)
    (sub,) = backend.submit(batch)
    assert directives((fake_slurm / "submitted.sh").read_text())["job-name"].strip('"') == name
    assert sub.record()["job_name"] == name and sub.record()["log_name"] == "train"
    # a sweep: every task of the array has the array's name
    plans = [backend.plan(load(overrides, fake_slurm / "s" / str(i)), JobSpec(fake_slurm / "s" / str(i), "train",
                                                                             job_num=i)) for i in range(2)]
    (batch,) = backend.batches(plans, fake_slurm / "s")
    write(batch)
    subs = backend.submit(batch)
    assert directives((fake_slurm / "submitted.sh").read_text())["job-name"].strip('"') == name
    assert [s.record()["job_name"] for s in subs] == [name, name]


def test_wait_reads_result_json_once_slurm_says_completed(fake_slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plans = sweep_plans(fake_slurm, 3)
    backend, (batch,) = sweep_batches(plans, fake_slurm / "sweep")
    subs = backend.submit(batch)
    monkeypatch.setattr(slurm, "time", _Clock())  # Slurm is first asked 2 s after the submit: on this clock
    for p in plans:
        write_run_id(p.job, "this-launch")  # as the driver does before it submits
    result = plans[0].job.job_dir / "result.json"
    result.write_text('{"loss": 1.5, "step": 5, "run_id": "this-launch"}')
    old = time.time() - 120  # written by a file server whose clock is 2 minutes behind this host's
    os.utime(result, (old, old))
    (ok,) = backend.wait([subs[0]])
    assert ok.ok and ok.value == {"loss": 1.5, "step": 5, "run_id": "this-launch"}
    stale = plans[2].job.job_dir / "result.json"  # an earlier launch's, its mtime (a clock ahead) in the future
    stale.write_text('{"loss": 9.9, "step": 5, "run_id": "an-earlier-launch"}')
    os.utime(stale, (time.time() + 120, time.time() + 120))
    _write_exe(fake_slurm / "fakebin" / "squeue", "#!/bin/sh\nprintf '42_2|COMPLETED|None\\n'\n")
    (not_this,) = backend.wait([subs[2]])
    assert not_this.state is JobState.FAILED and "result.json is an earlier launch's" in (not_this.error or "")
    _write_exe(fake_slurm / "fakebin" / "squeue", "#!/bin/sh\nprintf '42_1|FAILED|None\\n'\n")
    (failed,) = backend.wait([subs[1]])
    assert failed.state is JobState.FAILED and "Slurm state FAILED" in (failed.error or "")  # (id, log: the line's)


def test_an_empty_argument_stays_an_argument() -> None:
    assert slurm_plan._sh("") == "''" and slurm_plan._sh(slurm_plan._JOB_DIR) == '"$AUTOMODEL_JOB_DIR"'



def test_automodels_token_keys_stay_references_and_a_literal_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_HF", "hf_SECRET_value")
    text = script(["++slurm.hf_token=${MY_HF}", "++slurm.wandb_key=${WANDB_API_KEY}"])
    assert 'export HF_TOKEN="${MY_HF}"' in text and 'export WANDB_API_KEY="${WANDB_API_KEY}"' in text
    assert "hf_SECRET_value" not in text
    with pytest.raises(ConfigError, match="slurm.hf_token.*never written"):
        script(["++slurm.hf_token=hf_literal_token"])


def test_automodels_chdir_and_cli_keys(tmp_path: Path) -> None:
    assert "cd /lustre/work  # slurm.chdir" in script(["++slurm.chdir=/lustre/work"])
    # a home dir is the job user's on the nodes, never this machine's (a quoted ~ would stay a ~ for cd)
    assert 'cd "$HOME"/work  # slurm.chdir' in script(['++slurm.chdir="~/work"'])
    with pytest.warns(UserWarning, match="slurm.job_dir is set by AutoModel's own CLI"):
        script([f"++slurm.job_dir={tmp_path}"])


@pytest.mark.parametrize("form", ["'{src}:/opt/Automodel'", "{{source:{src},dest:/opt/Automodel}}"])
def test_automodels_nemo_mount_forms_mount_its_source_and_this_project(form: str, tmp_path: Path) -> None:
    text = script(["slurm.container_image=nvcr.io/nvidia/nemo:dev", f"slurm.nemo_mount={form.format(src=tmp_path)}"])
    mounts = next(a for a in text.split() if a.startswith("--container-mounts="))
    assert f"{tmp_path}:/opt/Automodel" in mounts and f"/src/automodel-hydra:{slurm_plan.PROJECT_MOUNT}" in mounts
    assert f"export PYTHONPATH={slurm_plan.PROJECT_MOUNT}:/opt/Automodel" in text
    missing = load(["slurm.container_image=img", f"slurm.nemo_mount='{tmp_path}/nope:/opt/Automodel'"])
    with pytest.raises(ConfigError, match="slurm.nemo_mount.source"):
        slurm.Slurm().preflight([missing])


def test_an_array_task_logs_its_array_id_not_its_raw_job_id() -> None:
    lines = [line for line in script().splitlines() if line.startswith(("job=", 'echo "automodel-hydra: job'))]
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "4250", "MASTER_ADDR": "node1", "MASTER_PORT": "13992"}
    array = subprocess.run(["bash", "-c", "\n".join(lines)], capture_output=True, text=True, check=True,
                           env={**env, "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "8"}).stderr
    single = subprocess.run(["bash", "-c", "\n".join(lines)], capture_output=True, text=True, check=True,
                            env=env).stderr
    assert "job 4242_8 rendezvous at node1:13992" in array and "job 4250 rendezvous" in single


def test_spot_resume_keys_plan_on_slurm(tmp_path: Path) -> None:
    """``restore_from: {path: /checkpoints/latest}`` with a short ``step_scheduler.checkpoint_interval``: the
    submitting host's checks accept it although ``/checkpoints`` holds nothing yet (a first run starts fresh), the
    job is planned, and every rank reads the path as written (``checkpoint.resume_target`` resolves it there)."""
    from automodel_hydra.config import host_problems, rank_spec

    keys = ["restore_from.path=/checkpoints/latest", "step_scheduler.checkpoint_interval=100"]
    cfg = load(keys)
    assert host_problems(cfg) == []
    p = slurm.Slurm().plan(cfg, JOB)
    assert "automodel_hydra.worker" in p.files["sbatch.sh"]
    spec = config.load_rank(rank_spec(cfg))
    assert (spec.restore_from.path, spec.step_scheduler.checkpoint_interval) == ("/checkpoints/latest", 100)
    (tmp_path / "file").write_text("")  # D/latest with D a file: one line naming the field
    (problem,) = host_problems(load([f"restore_from.path={tmp_path}/file/latest"]))
    assert problem.key == "restore_from.path" and "is not a directory" in str(problem)


def test_an_arrays_requeue_hook_is_given_each_task_and_its_job_dir(fake_slurm: Path) -> None:
    """The array script's hook line hands :mod:`automodel_hydra.retry` the array's task ids and job dirs (so that
    a node one member blames is left out of the pending ones and recorded in their dirs); for a resumed sweep's
    tasks 2 and 5, bash gives exactly {2: dir 2, 5: dir 5}. A single job's hook gets no such list."""
    from automodel_hydra import retry

    plans = [p for p in sweep_plans(fake_slurm / "a b", 6) if p.job.job_num in (2, 5)]
    _, (batch,) = sweep_batches(plans, fake_slurm / "a b" / "sweep")
    text = batch.files[fake_slurm / "a b" / "sweep" / "launch" / "sbatch_2.sh"]
    lines = text.splitlines()
    start = lines.index("job_dirs=(")
    block = lines[start:lines.index(")", start) + 1]
    (hook,) = [line for line in lines if " -m automodel_hydra.retry " in line]
    args = hook.split(" -m automodel_hydra.retry ", 1)[1]
    probe = "\n".join([*block, "AUTOMODEL_JOB_DIR=x status=1", f"printf '%s\\0' {args}"])
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout
    argv = out.split("\0")[:-1]
    assert argv[:2] == ["x", "1"]
    assert retry.array_dirs(argv[2:]) == {"2": str(plans[0].job.job_dir), "5": str(plans[1].job.job_dir)}
    assert "--array" not in plans[0].files["sbatch.sh"]
