"""CheckpointManager: DCP round trips (no process group, gloo world_size 1 and 2), the ``latest`` pointer only
moving after a complete save, crash leftovers being ignored, keep_latest_k and async saves."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from automodel_hydra import checkpoint as ck
from automodel_hydra.checkpoint import MODEL_AND_OPTIM, CheckpointManager, ModelOptimState, find_latest
from tests.helpers import free_port


def _model_and_optim(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def _state(seed: int) -> tuple[dict, torch.nn.Module, torch.optim.Optimizer]:
    model, opt = _model_and_optim(seed)
    return {MODEL_AND_OPTIM: ModelOptimState(model, opt)}, model, opt


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.fixture
def gloo_world1():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _roundtrip(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    state, model, opt = _state(0)
    mgr.save(7, state)
    fresh_state, fresh, fresh_opt = _state(1)
    assert not _same(model, fresh)
    assert mgr.load(fresh_state, "latest") == 7
    assert _same(model, fresh)
    exp_avg = opt.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], exp_avg)
    assert (tmp_path / "latest").read_text().strip() == "step-7"
    assert ck.is_complete(tmp_path / "step-7")


def test_roundtrip_without_process_group(tmp_path):
    assert not dist.is_initialized()
    _roundtrip(tmp_path)


def test_roundtrip_gloo_world_size_1(tmp_path, gloo_world1):
    _roundtrip(tmp_path)


def test_load_paths(tmp_path):
    mgr = CheckpointManager(tmp_path)
    state, *_ = _state(0)
    assert mgr.load(state, "latest") == 0  # nothing saved yet: fresh start
    mgr.save(3, state)
    mgr.save(5, state)
    assert mgr.load(_state(1)[0], str(tmp_path / "step-3")) == 3
    assert mgr.load(_state(1)[0], None) == 0
    with pytest.raises(FileNotFoundError, match="no .metadata"):
        mgr.load(_state(1)[0], str(tmp_path / "nothing-here"))


def test_disabled_is_a_no_op(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", enabled=False)
    state, *_ = _state(0)
    mgr.save(1, state)
    mgr.wait()
    mgr.close()
    assert not (tmp_path / "ck").exists()
    assert mgr.load(state, "latest") == 0


def test_incomplete_step_dirs_are_ignored(tmp_path):
    mgr = CheckpointManager(tmp_path)
    state, model, _ = _state(0)
    mgr.save(10, state)
    # a save killed after DCP's files but before the completion marker
    (tmp_path / "step-20").mkdir()
    (tmp_path / "step-20" / ".metadata").write_bytes(b"torn")
    # a marker without DCP's .metadata (killed mid-write of a re-save)
    (tmp_path / "step-30").mkdir()
    (tmp_path / "step-30" / ".complete").write_text("30\n")
    assert find_latest(tmp_path) == tmp_path / "step-10"
    for pointer in (None, "garbage", "step-30", "step-40"):  # missing or bad pointer: scan for complete dirs
        if pointer is None:
            (tmp_path / "latest").unlink(missing_ok=True)
        else:
            (tmp_path / "latest").write_text(pointer)
        assert find_latest(tmp_path) == tmp_path / "step-10", pointer
    fresh_state, fresh, _ = _state(1)
    assert mgr.load(fresh_state, "latest") == 10
    assert _same(model, fresh)


def test_pointer_only_moves_after_a_complete_save(tmp_path):
    mgr = CheckpointManager(tmp_path)
    state, *_ = _state(0)
    mgr.save(1, state)

    def crash(sd, checkpoint_id, **kw):  # writes some data, then the job dies before .metadata
        Path(checkpoint_id, "__0_0.distcp").write_bytes(b"partial")
        raise RuntimeError("killed")

    with mock.patch.object(ck.dcp, "save", side_effect=crash), pytest.raises(RuntimeError):
        mgr.save(2, state)
    assert (tmp_path / "latest").read_text().strip() == "step-1"
    assert not ck.is_complete(tmp_path / "step-2")
    assert mgr.load(_state(1)[0], "latest") == 1


def test_resave_of_a_step_replaces_leftovers(tmp_path):
    stale = tmp_path / "step-4"
    stale.mkdir(parents=True)
    (stale / "junk.distcp").write_bytes(b"old")
    (stale / ".complete").write_text("4\n")
    mgr = CheckpointManager(tmp_path)
    mgr.save(4, _state(0)[0])
    assert not (stale / "junk.distcp").exists()
    assert ck.is_complete(stale)


def _steps(ckpt: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in ckpt.glob("step-*"))


def test_keep_latest_k(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_latest_k=2)
    (tmp_path / "step-0").mkdir(parents=True)  # an old half-written leftover goes too
    state, *_ = _state(0)
    for step in (1, 2, 3, 4):
        mgr.save(step, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-3", "step-4"]
    assert find_latest(tmp_path) == tmp_path / "step-4"


def test_the_latest_3_are_kept_by_default_and_0_keeps_all(tmp_path):
    from automodel_hydra.config import CheckpointConfig

    assert CheckpointConfig().keep_latest_k == 3  # the recipe's default (checkpoint.keep_latest_k)
    state, *_ = _state(0)
    default, keep_all = CheckpointManager(tmp_path / "a"), CheckpointManager(tmp_path / "b", keep_latest_k=0)
    for step in range(1, 6):
        default.save(step, state)
        keep_all.save(step, state)
    assert _steps(tmp_path / "a") == [3, 4, 5] and find_latest(tmp_path / "a") == tmp_path / "a" / "step-5"
    assert _steps(tmp_path / "b") == [1, 2, 3, 4, 5]


def test_the_checkpoint_resumed_from_is_never_purged(tmp_path):
    state, model, _ = _state(0)
    first = CheckpointManager(tmp_path)
    for step in (10, 20, 30):
        first.save(step, state)
    # a run rewound to step 10 (restore_from.path=.../step-10) keeping 1: its restarts load step-10 again
    rewound = CheckpointManager(tmp_path, keep_latest_k=1)
    assert rewound.load(_state(1)[0], str(tmp_path / "step-10")) == 10
    for step in (11, 12, 13):
        rewound.save(step, state)
    assert _steps(tmp_path) == [10, 13, 20, 30]  # 11 and 12 purged; 20 and 30 belong to the later run
    assert find_latest(tmp_path) == tmp_path / "step-13"
    fresh_state, fresh, _ = _state(2)
    assert CheckpointManager(tmp_path).load(fresh_state, str(tmp_path / "step-10")) == 10  # a restart can load it
    assert _same(model, fresh)
    # resuming from "latest" protects that one the same way (and step-10 is no one's resume point any more)
    resumed = CheckpointManager(tmp_path, keep_latest_k=1)
    assert resumed.load(_state(1)[0], "latest") == 13
    for step in (14, 15):
        resumed.save(step, state)
    assert _steps(tmp_path) == [13, 15, 20, 30] and find_latest(tmp_path) == tmp_path / "step-15"


def test_a_complete_checkpoint_is_not_deleted_before_its_replacement_is_complete(tmp_path):
    state, model, _ = _state(0)
    old = CheckpointManager(tmp_path)
    for step in (1, 2, 3):
        old.save(step, state)
    # a fresh start in the same dir (restore_from.path=null) reaches step 3 again and dies while saving it
    new_state, new_model, _ = _state(5)
    rerun = CheckpointManager(tmp_path, keep_latest_k=1)

    def crash(sd, checkpoint_id, **kw):
        Path(checkpoint_id, "__0_0.distcp").write_bytes(b"partial")
        raise RuntimeError("killed")

    with mock.patch.object(ck.dcp, "save", side_effect=crash), pytest.raises(RuntimeError):
        rerun.save(3, new_state)
    assert find_latest(tmp_path) == tmp_path / "step-3" and ck.is_complete(tmp_path / "step-3")
    probe_state, probe, _ = _state(9)
    assert rerun.load(probe_state, "latest") == 3 and _same(model, probe)  # still the first run's step 3
    # the retried save replaces it whole, under its own name, and the newest is kept with keep_latest_k=1
    rerun.save(3, new_state)
    assert _steps(tmp_path) == [3] and not list(tmp_path.glob(".step-*"))
    assert rerun.load(probe_state, "latest") == 3 and _same(new_model, probe)


def test_async_save_then_wait(tmp_path):
    mgr = CheckpointManager(tmp_path, async_save=True)
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {MODEL_AND_OPTIM: ModelOptimState(model, opt)}
    expected = model.weight.detach().clone()
    mgr.save(1, state)
    assert not (tmp_path / "latest").exists()  # the pointer moves only once the save is known complete
    with torch.no_grad():
        model.weight.add_(100.0)  # training continues while the checkpoint is written
    mgr.wait()
    assert (tmp_path / "latest").read_text().strip() == "step-1"
    mgr.save(2, state)
    mgr.close()  # close also finalises the pending save
    assert find_latest(tmp_path) == tmp_path / "step-2"
    assert mgr.load(state, str(tmp_path / "step-1")) == 1
    assert torch.equal(model.weight, expected)


def _two_rank_worker(rank: int, port: int, root: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        torch.manual_seed(rank)  # different data per rank; DDP keeps the replicas equal
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        state = {MODEL_AND_OPTIM: ModelOptimState(model, opt)}
        saved = {k: v.clone() for k, v in model.module.state_dict().items()}
        for async_save, step in ((False, 5), (True, 6)):
            mgr = CheckpointManager(root, async_save=async_save, keep_latest_k=1)
            mgr.save(step, state)
            mgr.close()
            dist.barrier()
            assert find_latest(root) == Path(root) / f"step-{step}"
        assert sorted(os.listdir(root)) == ["latest", "step-6"]
        with torch.no_grad():
            model.module.weight.zero_()
        assert CheckpointManager(root).load(state, "latest") == 6
        for k, v in model.module.state_dict().items():
            assert torch.equal(v, saved[k]), k
        assert opt.state_dict()["state"][0]["step"].item() == 1
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # spawns 2 processes
def test_two_ranks_gloo(tmp_path):
    mp.spawn(_two_rank_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)


def test_resume_target_of_a_latest_path(tmp_path):
    """``D/latest``: the newest complete checkpoint of the job's own dir, else of D; a fresh start with neither."""
    own, other = tmp_path / "own", tmp_path / "other"
    for d, steps in ((other, (2, 4)), (own, ())):
        for step in steps:
            CheckpointManager(d, keep_latest_k=0).save(step, {"w": torch.ones(1)})
    (other / "step-6").mkdir()
    (other / "step-6" / ck.METADATA).write_text("")  # a newer save that never completed (no marker)
    (other / ck.POINTER).unlink()  # and the pointer lost: the scan must still skip step-6
    assert ck.resume_target(own, other / "latest") == other / "step-4"
    assert ck.resume_target(own, tmp_path / "nothing" / "latest") is None  # fresh start
    CheckpointManager(own).save(8, {"w": torch.ones(1)})
    assert ck.resume_target(own, other / "latest") == own / "step-8"  # a restarted job continues its own progress
    assert ck.resume_target(own, "latest") == own / "step-8" and ck.resume_target(own, None) is None
    assert ck.pointer_dir(other / "step-4") is None and ck.pointer_dir("latest") is None


@pytest.mark.slow
def test_a_run_resumes_the_newest_complete_checkpoint_of_a_latest_path(tmp_path):
    """Two real 2-rank runs: A checkpoints steps 2 and 4; a newer save of A (step 6) never completed and A's pointer
    is lost. B, in a new run dir with ``restore_from.path=<A>/checkpoints/latest`` (the spot-resume key's form),
    resumes A's step 4; run again (a requeue), B continues from its own step 6, not from A's again."""
    import shutil

    from tests.helpers import metrics, train_py

    two = ("interactive.nproc_per_node=2", "step_scheduler.checkpoint_interval=2", "step_scheduler.log_interval=1")
    a, b = tmp_path / "A", tmp_path / "B"
    train_py(f"hydra.run.dir={a}", *two, "step_scheduler.max_steps=4")
    shutil.copytree(a / "checkpoints" / "step-4", a / "checkpoints" / "step-6")
    (a / "checkpoints" / "step-6" / ck.COMPLETE_MARKER).unlink()
    (a / "checkpoints" / ck.POINTER).unlink()
    latest = f"restore_from.path={a}/checkpoints/latest"
    first = train_py(f"hydra.run.dir={b}", *two, latest, "step_scheduler.max_steps=6")
    assert f"restored step 4 from {a}/checkpoints/step-4" in first.stdout, first.stdout[-3000:]
    assert [m["step"] for m in metrics(b) if "loss" in m][:1] == [5]
    again = train_py(f"hydra.run.dir={b}", *two, latest, "step_scheduler.max_steps=8")
    assert f"restored step 6 from {b}/checkpoints/step-6" in again.stdout, again.stdout[-3000:]
