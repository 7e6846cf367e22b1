"""A local sweep packs its jobs onto what the environment already allows: the GPUs of a CUDA_VISIBLE_DEVICES the
user or Slurm set, the cores of the affinity mask this process was started with, and the user's thread count.

There is no GPU on the test machines: where a test needs a GPU count, ``cuda_device_count`` is replaced by a
stand-in that returns one (named ``_stand_in_gpu_count``); the jobs are real processes started by the real
scheduler, each writing what it was given.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from automodel_hydra.backends import interactive
from automodel_hydra.plan import Batch, JobSpec, Plan, new_run_id, write_run_id

#: each job's script: what it was started with (its CUDA_VISIBLE_DEVICES, thread count and cores)
_SCRIPT = """#!/usr/bin/env bash
printf '%s\\n' "${CUDA_VISIBLE_DEVICES-<unset>}" "${OMP_NUM_THREADS-<unset>}" \
  "$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')" > "$(dirname "$0")/seen"
printf '{"loss": 1.0, "run_id": "%s"}\n' "$(cat "$(dirname "$0")/run_id")" > "$(dirname "$0")/../result.json"
"""


def _stand_in_gpu_count(n: int):  # stands in for the GPUs this machine does not have
    return lambda: n


def _plans(tmp_path: Path, n: int, uses_gpus: bool, nproc: int = 1) -> list[Plan[interactive.Request]]:
    plans = []
    for i in range(n):
        job = JobSpec(job_dir=tmp_path / str(i), job_name="pack", job_num=i)
        job.launch_dir.mkdir(parents=True)
        (job.launch_dir / interactive.SCRIPT).write_text(_SCRIPT)
        write_run_id(job, new_run_id())  # what the driver writes before submitting; the script echoes it
        request = interactive.Request(nproc, None, None, uses_gpus, (), None)
        plans.append(Plan("interactive", job, {interactive.SCRIPT: _SCRIPT}, request))
    return plans


def _run(plans: list[Plan[interactive.Request]]) -> list[list[str]]:
    local = interactive.Interactive()
    subs = local.submit(Batch(tuple(plans), {}))
    results = local.wait(subs)
    assert all(r.ok for r in results), [r.error for r in results]
    return [(p.job.launch_dir / "seen").read_text().splitlines() for p in plans]


def test_sweep_jobs_land_on_the_visible_gpus_not_on_0_and_1(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # set by the user, or by Slurm for this allocation
    monkeypatch.setattr(interactive, "cuda_device_count", _stand_in_gpu_count(2))
    seen = _run(_plans(tmp_path, 2, uses_gpus=True))
    assert sorted(s[0] for s in seen) == ["2", "3"]


def test_gpu_uuids_and_a_list_cut_at_what_cuda_sees(monkeypatch) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa, MIG-bbbb,7,bogus,5"}
    assert interactive.visible_gpus(3, env) == ["GPU-aaaa", "MIG-bbbb", "7"]  # CUDA stops at the invalid entry
    assert interactive.visible_gpus(2, {}) == ["0", "1"]
    assert interactive.visible_gpus(0, {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert interactive.pack_env(["GPU-aaaa"], True, 1, env) == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}


def test_cpu_packing_stays_inside_the_affinity_mask_and_keeps_the_users_threads(tmp_path, monkeypatch) -> None:
    mask = sorted(os.sched_getaffinity(0))
    if len(mask) < 2:
        pytest.skip("needs 2 cores in this process's affinity mask")
    allowed = {mask[-1]}  # as `taskset -c N` or Slurm's --cpu-bind would leave it
    os.sched_setaffinity(0, allowed)
    try:
        monkeypatch.setattr(interactive, "cuda_device_count", lambda: 0)
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's thread count
        seen = _run(_plans(tmp_path, 2, uses_gpus=False))
    finally:
        os.sched_setaffinity(0, mask)
    for _, threads, cores in seen:
        assert {int(c) for c in cores.split(",")} <= allowed
        assert threads == "3"
    assert interactive.pack_env([0, 1, 2, 3], False, 2, {}) == {"OMP_NUM_THREADS": "2"}
    assert interactive.pack_env([0, 1], False, 1, {"OMP_NUM_THREADS": "1"}) == {}
