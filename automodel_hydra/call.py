"""A Hydra job of a task function that is not declared ``@launchable`` (any Hydra app), run by our launcher on
the chosen backend as one process: ``python -u -m automodel_hydra.call <job dir>/launch/call.pkl``.

The way hydra-submitit-launcher ships a job (its ``BaseSubmititLauncher.__call__``): the submitting side pickles
the task function, the job's composed config, Hydra's context (config loader, callbacks) and Hydra's global state
(``Singleton.get_state()``: the ConfigStore, the job's runtime name, OmegaConf's resolvers, a custom one
included) with cloudpickle, so a closure or a function of ``__main__`` travels by value. This process puts that
state back, goes to the submitting dir, and runs the job through Hydra's own ``run_job`` with the sweep's
``hydra.sweep.dir``/``hydra.sweep.subdir``, exactly as Hydra's basic launcher does in-process: the job dir,
``.hydra/``, the job's log, ``hydra.job.chdir``, ``hydra.job.env_set`` and the ``on_job_start``/``on_job_end``
callbacks all come from ``run_job``.

Files (in the job's ``launch/``): ``call.pkl`` is three pickles in a row. First the header, a plain pickle of a
dict: ``sys_path``, the submitting process's ``sys.path`` (the app's own modules are pickled by reference against
it), and ``cwd``, its working dir (relative sweep dirs, ``get_original_cwd``); it is read first, so that both are
in place before anything of the app is unpickled. Then the shared part (task function, Hydra context, Hydra's
global state; the same bytes for every job of a launch), then the job's config. The JobReturn comes back as
``call_result.pkl`` when the task function returned, as ``call_error.pkl`` when it raised (written atomically; a
return value or exception that cannot be pickled is replaced by a RuntimeError saying so); like ``call.pkl`` it
starts with a plain pickled header, ``{"run_id": <launch/run_id>}``, so the launcher tells this launch's JobReturn
from an earlier one's without comparing clocks (:func:`automodel_hydra.plan.written_by_this_launch`). Exit
status: 0 when the task function returned, 1 when it raised, so the scheduler's state says FAILED too.

Submitted through ``slurm.tunnel`` (``AUTOMODEL_CALL_DIR`` set by the batch script: the job's dir on the login
node), the submitting machine's dirs do not exist where this runs: the job starts in the snapshot's copy of the
submitting dir (else where the script started it), and Hydra's job dir is ``AUTOMODEL_CALL_DIR``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import pickle
import sys
import traceback
import typing as tp
from pathlib import Path

from automodel_hydra.plan import CALL_ERROR_FILE, CALL_RESULT_FILE, read_run_id
from automodel_hydra.schema import USER_ERROR_EXIT

log = logging.getLogger("automodel_hydra.call")


def shared_payload(task_function: tp.Callable[..., tp.Any], hydra_context: tp.Any) -> bytes:
    """The part of ``call.pkl`` every job of one launch shares: the task function, Hydra's context and Hydra's
    global state now (cloudpickle: closures and ``__main__`` functions by value)."""
    import cloudpickle
    from hydra.core.singleton import Singleton

    return bytes(cloudpickle.dumps((task_function, hydra_context, Singleton.get_state())))


def payload(shared: bytes, config: tp.Any) -> bytes:
    """The bytes of one job's ``call.pkl``: the header (this process's ``sys.path`` and working dir), ``shared``
    (:func:`shared_payload`), the job's composed config (with ``hydra.job.id``/``num`` set)."""
    import cloudpickle

    header = pickle.dumps({"sys_path": list(sys.path), "cwd": os.getcwd()})
    return header + shared + bytes(cloudpickle.dumps(config))


def read_job_return(path: Path) -> tp.Any:
    """The JobReturn a call job's process wrote (``launch/call_result.pkl``). Raises OSError or
    pickle.UnpicklingError when it cannot be read."""
    with Path(path).open("rb") as f:
        pickle.load(f)  # the header: {"run_id": ...}
        return pickle.load(f)


def outcome(ret: tp.Any) -> tp.Any:
    """A JobReturn's return value, or the exception its task function raised (Hydra's public getter re-raises
    it, after a line on stderr that is not wanted here)."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return ret.return_value
    except Exception as e:
        return e


def _write_job_return(launch_dir: Path, ret: tp.Any) -> bool:
    """Pickle ``ret`` into ``launch_dir``; returns whether the job completed."""
    import cloudpickle
    from hydra.core.utils import JobStatus

    try:
        data = cloudpickle.dumps(ret)
    except Exception as e:  # the value or exception cannot travel back: say so, keep the rest of the JobReturn
        what = "exception" if ret.status == JobStatus.FAILED else "return value"
        ret.return_value = RuntimeError(f"the task function's {what} ({type(outcome(ret)).__name__}) cannot be "
                                        f"pickled, so it cannot be sent back to the launcher: {e}")
        ret.status = JobStatus.FAILED
        data = cloudpickle.dumps(ret)
    ok = ret.status == JobStatus.COMPLETED
    path = launch_dir / (CALL_RESULT_FILE if ok else CALL_ERROR_FILE)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(pickle.dumps({"run_id": read_run_id(launch_dir)}) + data)
    os.replace(tmp, path)
    return ok


def _reporting(task_function: tp.Callable[[tp.Any], tp.Any]) -> tp.Callable[[tp.Any], tp.Any]:
    """``task_function``, with a failure that is no ``Exception`` (torch's ``CheckpointException``) raised as its
    cause (:func:`automodel_hydra.worker.failure_cause`): Hydra's ``run_job`` keeps only ``Exception``s in the
    JobReturn, so anything else would end the process with no ``call_error.pkl`` and no cause for the launcher."""
    from automodel_hydra.worker import failure_cause

    @functools.wraps(task_function)
    def wrapped(cfg: tp.Any) -> tp.Any:
        try:
            return task_function(cfg)
        except (Exception, SystemExit, KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as e:
            raise failure_cause(e) from e

    return wrapped


def run(call_file: Path) -> int:
    """Run the call in ``call_file`` through Hydra's ``run_job``; write the JobReturn beside it
    (``call_result.pkl``, or ``call_error.pkl`` when the task function raised). Returns the exit status: 0 when
    the task function returned, 1 when it raised."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobStatus, run_job, setup_globals

    call_file = Path(call_file).resolve()
    with call_file.open("rb") as f:
        header = pickle.load(f)
        paths = _snapshot_paths(header["sys_path"], os.environ)
        sys.path[:0] = [p for p in dict.fromkeys(paths) if p not in sys.path]
        task_function, hydra_context, state = pickle.load(f)
        config = pickle.load(f)
    cwd = header["cwd"]
    call_dir = os.environ.get("AUTOMODEL_CALL_DIR")
    if call_dir:  # submitted through slurm.tunnel: the submitting machine's dirs are not here
        from omegaconf import open_dict, read_write

        cwd = _snapshot_paths([cwd], os.environ)[0]  # the snapshot's copy of the submitting dir
        cwd = cwd if os.path.isdir(cwd) else os.getcwd()
        with read_write(config.hydra), open_dict(config):
            config.hydra.sweep.dir, config.hydra.sweep.subdir = call_dir, "."
    os.chdir(cwd)
    Singleton.set_state(state)
    setup_globals()
    ret = run_job(hydra_context=hydra_context, task_function=_reporting(task_function), config=config,
                  job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    if ret.status == JobStatus.FAILED:  # run_job keeps the exception for the launcher; the job's log shows it too
        error = outcome(ret)
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        print(f"automodel-hydra: the task function raised:\n{text}", file=sys.stderr, flush=True)
    ok = _write_job_return(call_file.parent, ret)
    return 0 if ok else 1


def _snapshot_paths(paths: tp.Sequence[str], environ: tp.Mapping[str, str]) -> list[str]:
    """The submitting process's ``sys.path`` for this process: under a code snapshot (``AUTOMODEL_CODE_ROOT``, the
    snapshot's source dir there, and ``AUTOMODEL_CODE_SRC``, its copy here: :mod:`automodel_hydra.snapshot`) an
    entry inside the source dir becomes the same dir in the copy where the copy has it, so the app's modules are
    unpickled from the submitted code."""
    from automodel_hydra.snapshot import CODE_ROOT_VAR, CODE_SRC_VAR

    root, src = environ.get(CODE_ROOT_VAR), environ.get(CODE_SRC_VAR)
    if not root or not src:
        return list(paths)
    from automodel_hydra.snapshot import remap

    out = []
    for p in paths:
        mapped = remap(p, root, src)
        out.append(mapped if mapped != p and os.path.isdir(mapped) else p)
    return out


def main(argv: tp.Sequence[str] | None = None) -> int:
    from automodel_hydra import streams

    streams.best_effort()  # the task function's prints: a reader that goes away never fails the job
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m automodel_hydra.call <job dir>/launch/call.pkl", file=sys.stderr)
        return USER_ERROR_EXIT
    return run(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
