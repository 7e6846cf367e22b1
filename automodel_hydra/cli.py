"""``automodel-hydra``: run a config file (AutoModel's CLI shapes), and operate runs and sweeps after launch.

    automodel-hydra FILE.yaml [--a.b=c] [-m a.b=x,y]   run FILE (an AutoModel YAML as it is) on our launchers
    automodel-hydra finetune llm -c FILE.yaml [--nproc-per-node N]   AutoModel's older CLI (kd|benchmark, vlm)
    automodel-hydra FILE.yaml --help        the file's launchers, keys and commands
    automodel-hydra runs                    past runs and sweeps here: dir, launcher, jobs, states, when
    automodel-hydra status [DIR]            one row per job: number, overrides, backend, job id(s), state, step
    automodel-hydra logs [DIR] [JOB]        follow a job's log until the job ends (--no-follow: print and exit)
    automodel-hydra cancel DIR [JOB]        cancel every job of DIR, or job number JOB
    automodel-hydra resume DIR              run a sweep again: COMPLETED members kept, the others run again
    automodel-hydra report [DIR]            final metrics, loss curves (DIR/report/loss.png), failures' cost

DIR is a run dir (``launch/submission.json``) or a sweep dir (``launch/manifest.json``; without one, its jobs'
``*/launch/submission.json``). Without DIR: the newest run or sweep under ./outputs and ./multirun (Hydra's
default output dirs), found by the time its launch record was written. States come from each job's backend
(``status(record)``: sacct/squeue for Slurm, SkyPilot's job queue, the process and its ``result.json`` locally) and
use Slurm's names (``automodel_hydra.states.JobState``); a state the backend cannot determine is shown as UNKNOWN,
never guessed.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import os
import sys
import time
import typing as tp
from pathlib import Path

from automodel_hydra import records as run_records
from automodel_hydra import version_line
from automodel_hydra.display import STYLE as _STYLE
from automodel_hydra.display import fmt as _fmt
from automodel_hydra.display import show as _show
from automodel_hydra.display import table as _table
from automodel_hydra.plan import LAUNCH_DIR, launch_dir
from automodel_hydra.schema import USER_ERROR_EXIT, UserError
from automodel_hydra.states import JobState
from automodel_hydra.stops import CTRL_C_EXIT

Record = dict[str, tp.Any]

#: Where runs and sweeps are looked for without a DIR: Hydra's default ``hydra.run.dir`` / ``hydra.sweep.dir`` roots.
SEARCH_ROOTS = ("outputs", "multirun")
#: How deep below a search root a run or sweep dir may sit (Hydra's default ``DATE/TIME`` is depth 2).
SEARCH_DEPTH = 4


class CliError(UserError):
    """A mistake the user can fix; printed as one line, exit status 2."""


# ----------------------------------------------------------------------------------------------- records


def load_records(path: str | Path) -> list[Record]:
    """The submission records of a run or sweep dir, ordered by job number."""
    root = Path(path)
    records = run_records.load(root)
    if not records:
        raise CliError(f"{root} holds no launch/manifest.json, launch/submission.json or */launch/submission.json: "
                       "not a run or sweep dir of automodel-hydra (or nothing was submitted there yet)")
    return sorted(records, key=job_num)


def job_num(record: Record) -> int:
    return record.get("job_num") or 0


def select(records: list[Record], job: int | None) -> list[Record]:
    """All records, or the one whose job number is ``job``."""
    if job is None:
        return records
    chosen = [r for r in records if job_num(r) == job]
    if not chosen:
        raise CliError(f"no job {job} here; jobs: {', '.join(str(job_num(r)) for r in records)}")
    return chosen


def job_state(record: Record) -> tuple[JobState, str]:
    """``(state, note)`` from the job's backend; ``(UNKNOWN, why)`` when the backend cannot tell."""
    from automodel_hydra.progress import backend_states

    info = backend_states([record])[0]
    return info.state, info.reason


# ----------------------------------------------------------------------------------------------- finding runs


@dataclasses.dataclass(frozen=True)
class RunDir:
    """A run or sweep dir found under a search root; ``mtime`` is when its launch record was last written."""

    path: Path
    sweep: bool
    mtime: float


def find_runs(base: str | Path = ".") -> list[RunDir]:
    """Run and sweep dirs under ``base``/outputs and ``base``/multirun, newest first.

    A bounded walk: it goes at most :data:`SEARCH_DEPTH` levels down and never into a job dir (one with ``.hydra/``
    or ``launch/``) or a sweep dir (one with Hydra's ``multirun.yaml``), so checkpoints and big output trees are
    never read. A dir counts when it holds a launch record, i.e. when something was submitted there."""
    found = []
    for top in SEARCH_ROOTS:
        stack = [(Path(base).resolve() / top, 0)]
        while stack:
            d, depth = stack.pop()
            sweep = (d / "multirun.yaml").is_file() or run_records.is_sweep_dir(d)
            if sweep or launch_dir(d).is_dir() or (d / ".hydra").is_dir():
                mtime = run_records.newest_record_mtime(d, sweep)
                if mtime is not None:
                    found.append(RunDir(d, sweep, mtime))
                continue
            if depth >= SEARCH_DEPTH:
                continue
            try:
                children = [e for e in os.scandir(d) if e.is_dir() and not e.name.startswith(".")]
            except OSError:  # missing or unreadable
                continue
            stack += [(Path(e.path), depth + 1) for e in children]
    return sorted(found, key=lambda r: r.mtime, reverse=True)


def resolve_dir(arg: str | None) -> Path:
    """``arg``, or without one the newest run or sweep here (:func:`find_runs`), announced on stderr.

    Raises CliError when there is none."""
    if arg is not None:
        return Path(arg)
    runs = find_runs()
    if not runs:
        raise CliError(f"no run or sweep under {Path.cwd() / SEARCH_ROOTS[0]} or {Path.cwd() / SEARCH_ROOTS[1]}; "
                       "name its DIR (hydra.run.dir / hydra.sweep.dir)")
    print(f"latest {'sweep' if runs[0].sweep else 'run'}: {runs[0].path}", file=sys.stderr)
    return runs[0].path


# ----------------------------------------------------------------------------------------------- output helpers


def job_ids(record: Record) -> list[str]:
    """The job's ids: the record's, or (a local job, whose pid is written just after its record) its reference's."""
    ids = [str(i) for i in record.get("job_ids") or []]
    if not ids:
        from automodel_hydra import backends

        try:
            impl = backends.get(str(record.get("backend")))
            ids = [str(i) for i in getattr(impl.ref_from_record(record), "ids", None) or [] if i]
        except Exception:  # a record of no backend of ours, or one it cannot read: it has the ids it has
            return []
    return ids


def split_overrides(records: list[Record]) -> tuple[list[str], dict[int, str]]:
    """The overrides every job shares, and per job the ones that vary (what tells the jobs of a sweep apart;
    ``"-"`` where none does: a single run's overrides are all shared)."""
    sets = [set(r.get("overrides", [])) for r in records]
    common = set.intersection(*sets)
    shared = [o for o in records[0].get("overrides", []) if o in common]
    return shared, {job_num(r): " ".join(o for o in r.get("overrides", []) if o not in common) or "-" for r in records}


def _when(record: Record) -> str:
    """``submitted_at`` in local time, ``YYYY-MM-DD HH:MM``."""
    try:
        t = datetime.datetime.fromisoformat(record["submitted_at"])
    except (KeyError, TypeError, ValueError):
        return "-"
    return t.astimezone().strftime("%Y-%m-%d %H:%M")


def summarize_states(states: tp.Iterable[JobState]) -> str:
    """``"2 COMPLETED, 1 FAILED"`` (most frequent first)."""
    return ", ".join(f"{n} {s.value}" for s, n in collections.Counter(states).most_common())


# ----------------------------------------------------------------------------------------------- commands


def cmd_runs(args: argparse.Namespace) -> int:
    from automodel_hydra.progress import backend_states

    runs = find_runs()[: args.limit or None]
    if not runs:
        print(f"no runs or sweeps under {Path.cwd() / SEARCH_ROOTS[0]} or {Path.cwd() / SEARCH_ROOTS[1]}",
              file=sys.stderr)
        return 1
    per_run = []
    for run in runs:
        try:
            per_run.append(load_records(run.path))
        except (CliError, OSError, ValueError, KeyError):  # a record torn mid-write: list the dir, UNKNOWN state
            per_run.append([])
    flat = [r for records in per_run for r in records]
    states = iter(info.state for info in backend_states(flat))  # one pass: a backend is asked once per listing
    rows: list[dict[str, tp.Any]] = []
    for run, records in zip(runs, per_run):
        job_states = [next(states) for _ in records]
        rows.append({"dir": os.path.relpath(run.path), "kind": "sweep" if run.sweep else "run",
                     "launcher": ",".join(sorted({r["backend"] for r in records})) or "-", "jobs": len(records),
                     "states": {s.value: n for s, n in collections.Counter(job_states).items()},
                     "when": _when(records[0]) if records else
                     datetime.datetime.fromtimestamp(run.mtime).strftime("%Y-%m-%d %H:%M")})
        rows[-1]["_summary"] = summarize_states(job_states) or "-"
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows], indent=2))
        return 0
    from rich.text import Text

    table = _table()
    for name in ("dir", "kind", "launcher", "jobs", "states", "when"):
        table.add_column(name, no_wrap=True, justify="right" if name == "jobs" else "left")
    for r in rows:
        table.add_row(Text(r["dir"]), r["kind"], r["launcher"], str(r["jobs"]), Text(r["_summary"]), r["when"])
    _show(f"{len(rows)} newest run(s)/sweep(s) under {Path.cwd()}", table)
    return 0


def fetch_remote(records: list[Record]) -> None:
    """Bring back what jobs that ran elsewhere wrote so far (results, metrics, logs: a ``slurm.tunnel`` job's login
    node), each through its backend (:meth:`~automodel_hydra.plan.Backend.fetch_results`), so that what is read here
    is what the jobs wrote there; a cluster that cannot be reached leaves the copies as they are. The jobs that
    ended are fetched by :func:`automodel_hydra.progress.backend_states`, once, before their state is judged."""
    from automodel_hydra import backends

    by: dict[str, list[Record]] = {}
    for rec in records:
        by.setdefault(rec["backend"], []).append(rec)
    for name, group in by.items():
        impl = backends.get(name)
        impl.fetch_results([(impl.ref_from_record(r), Path(r["job_dir"]), r.get("log_path")) for r in group])


def log_reader(record: Record, path: Path) -> tp.Callable[[int], tuple[int, bytes] | None]:
    """Reads the job's log from an offset where its backend says it is written
    (:meth:`~automodel_hydra.plan.Backend.read_log`: this file, or a ``slurm.tunnel`` job's on its login node)."""
    from automodel_hydra import backends

    impl = backends.get(record["backend"])
    ref = impl.ref_from_record(record)
    return lambda pos: impl.read_log(ref, path, pos)


def cmd_status(args: argparse.Namespace) -> int:
    from automodel_hydra.progress import backend_states
    from automodel_hydra.report import job_attempts, last_logged, number

    root = resolve_dir(args.dir)
    records = load_records(root)
    infos = backend_states(records)  # (it copies back what the ended jobs wrote: their results decide their state)
    fetch_remote([r for r, i in zip(records, infos) if not i.state.final])  # the others' logs and metrics so far
    shared, varying = split_overrides(records)
    rows = []
    for rec, info in zip(records, infos):
        # a pending job has logged nothing: its files are not read (a big sweep's status stays one query)
        logged = last_logged(Path(rec["job_dir"])) if info.state is not JobState.PENDING else None
        rows.append({"job": job_num(rec), "overrides": rec.get("overrides", []), "backend": rec["backend"],
                     # the scheduler's name for it (sbatch --job-name, SkyPilot's task name; locally Hydra's)
                     "name": rec.get("job_name") or "-",
                     "job_ids": job_ids(rec), "state": info.state.value,
                     "step": logged["step"] if logged else None,
                     "loss": logged.get("loss") if logged and number(logged.get("loss")) else None,
                     "note": "; ".join(x for x in (_note(rec, info.state, info.reason), _ft_note(rec, info.state),
                                                   _excluded_note(rec)) if x),
                     "job_dir": rec["job_dir"]})
        if args.json:
            rows[-1].update(job_attempts(rec, info.state))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.text import Text  # plain text, never markup: overrides may hold "[...]"

    # what fits on a screen: the overrides column holds what tells the jobs apart, and what is the same for every
    # job (its shared overrides, a reason the backend gave for all of them) is said once, below the table
    notes = {r["note"] for r in rows}
    common_note = notes.pop() if len(notes) == 1 else ""
    table = _table()
    any_step = any(r["step"] is not None for r in rows)
    columns = ["job", *(["overrides"] if any(v != "-" for v in varying.values()) else []),
               "backend", "name", "id", "state", *(["step", "loss"] if any_step else []),
               *(["note"] if any(r["note"] for r in rows) and not common_note else [])]
    for name in columns:
        table.add_column(name, no_wrap=name not in ("overrides", "note"),
                         justify="right" if name in ("job", "step", "loss") else "left")
    for r in rows:
        state = JobState(r["state"])
        cells = {"job": Text(str(r["job"])), "overrides": Text(varying[r["job"]]), "backend": Text(r["backend"]),
                 "name": Text(r["name"]), "id": Text(",".join(r["job_ids"]) or "-"),
                 "state": Text(state.value, style=_STYLE.get(state, "")), "note": Text(r["note"]),
                 "step": Text(_fmt(r["step"])), "loss": Text(_fmt(r["loss"]))}
        table.add_row(*(cells[name] for name in columns))
    sweep = len(rows) > 1
    _show(f"{root}: {len(rows)} job(s)", table,
          [*([f"{'every job' if sweep else 'overrides'}: {' '.join(shared)}"] if shared else []),
           *([f"{'note for every job' if sweep else 'note'}: {common_note}"] if common_note else [])])
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    dir_arg, job = args.dir, args.job
    if dir_arg is not None and job is None and dir_arg.isdigit() and not Path(dir_arg).exists():
        job = int(dir_arg)  # `automodel-hydra logs 3`: job 3 of the latest sweep
        dir_arg = None
    root = resolve_dir(dir_arg)
    records = select(load_records(root), job)
    if len(records) > 1:
        raise CliError(f"{root} has {len(records)} jobs; name one: automodel-hydra logs {root} JOB "
                       f"(JOB in {', '.join(str(job_num(r)) for r in records)})")
    rec = records[0]
    path = Path(rec.get("log_path") or Path(rec["job_dir"]) / f"{rec.get('log_name', 'train')}.log")
    return follow(path, rec, follow_=not args.no_follow, poll_s=args.poll, read=log_reader(rec, path))


def follow(path: Path, record: Record, *, follow_: bool = True, poll_s: float = 1.0,
           out: tp.TextIO | None = None, read: tp.Callable[[int], tuple[int, bytes] | None] | None = None) -> int:
    """Print ``path``; when following, keep printing what is appended until the job reaches a final state.
    ``read(pos)``: the log's bytes from ``pos`` as ``(offset, data)``, None while there is none (default: the
    local file; :func:`log_reader`: where the job's backend says it is written).

    While there is no log yet, the job's state and the scheduler's reason are printed to stderr, once and on each
    change (``-- job 0: PENDING (BeginTime); no log yet at PATH``); a job that ends without ever writing one (one
    cancelled while pending) ends the wait with a line saying so. Returns 0, or 1 when no log was found and the job
    did not complete."""
    from automodel_hydra.plan import read_from
    from automodel_hydra.progress import backend_states

    out = out or sys.stdout
    read = read or (lambda pos: read_from(path, pos))
    pos, state, checked, seen, shown = 0, None, 0.0, False, ("", "")
    try:
        while True:
            got = read(pos)
            if got is not None:
                seen = True
                pos, chunk = got
                pos += len(chunk)
                if chunk:
                    out.write(chunk.decode(errors="replace"))
                    out.flush()
            if not follow_ or (state is not None and state.final):
                break
            if time.monotonic() - checked >= max(poll_s, 2.0):
                info, checked = backend_states([record])[0], time.monotonic()
                state, reason = info.state, info.reason
                if not info.answered and not state.final:  # (the scheduler will not say when it ends)
                    print(f"-- job {job_num(record)}: {state.value}, {reason}; not following it", file=sys.stderr)
                    return 1
                if not seen and not state.final and (state.value, reason) != shown:
                    shown = (state.value, reason)
                    note = f" ({_note(record, state, reason)})" if reason else ""
                    print(f"-- job {job_num(record)}: {state.value}{note}; no log yet at {path}", file=sys.stderr,
                          flush=True)
                continue  # one more read after a final state, so no trailing line is lost
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return CTRL_C_EXIT
    if not seen:
        final = state or job_state(record)[0]
        if follow_ and final.final:
            print(f"-- job {job_num(record)} ended {final.value} without writing a log (expected at {path})",
                  file=sys.stderr)
            return 0 if final is JobState.COMPLETED else 1
        print(f"no log yet at {path} (job {job_num(record)}: {final.value})", file=sys.stderr)
        return 1
    if follow_ and state is not None:
        print(f"-- job {job_num(record)} ended {state.value} (log: {path})", file=sys.stderr)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """Run the sweep's recorded command again in its recorded working dir, with ``hydra.sweep.dir`` pinned to
    DIR: the launcher keeps the COMPLETED members and runs the others again (:mod:`automodel_hydra.resume`)."""
    from automodel_hydra import resume

    root = Path(args.dir).resolve()
    refusal = resume.refusal(root)
    if refusal is not None:
        raise CliError(refusal)
    definition = tp.cast(resume.Definition, resume.recorded_definition(run_records.read_manifest(root)))
    if not Path(definition.cwd).is_dir():
        raise CliError(f"{root}: the sweep was launched from {definition.cwd}, which is gone; run its command "
                       f"again from where its config is: {' '.join(resume.command(definition, root))}")
    os.chdir(definition.cwd)
    os.environ[resume.RESUMING_ENV] = str(root)  # its lines then speak of this command (resume.resume_line)
    os.execv(sys.executable, [sys.executable, *resume.command(definition, root)])


def cmd_cancel(args: argparse.Namespace) -> int:
    from automodel_hydra import backends
    from automodel_hydra.progress import backend_states

    status = 0
    for rec in select(load_records(resolve_dir(args.dir)), args.job):
        info = backend_states([rec])[0]
        state = info.state
        impl = backends.get(rec["backend"])
        ref = impl.ref_from_record(rec)
        what = f"job {job_num(rec)} ({rec['backend']} {','.join(job_ids(rec)) or '-'})"
        if state.final:
            print(f"{what}: already {state.value}, nothing to cancel")
            continue
        if not info.answered:  # scancel would not be heard either, and no cancel may be recorded
            print(f"{what}: {info.reason}; nothing cancelled", file=sys.stderr)
            status = 1
            continue
        impl.cancel([ref])
        if job_ids(rec):  # what we sent is known, whether or not the scheduler keeps a record of it
            run_records.write_cancel(launch_dir(rec["job_dir"]), job_ids(rec), state, by="automodel-hydra cancel")
        print(f"{what}: was {state.value}, cancel requested")
    return status


# ----------------------------------------------------------------------------------------------- report


def cmd_report(args: argparse.Namespace) -> int:
    """``automodel-hydra report [DIR]``: :func:`automodel_hydra.report.report` of the dir's jobs."""
    from automodel_hydra import report
    from automodel_hydra.progress import backend_states

    root = resolve_dir(args.dir)
    records = load_records(root)
    states = [info.state for info in backend_states(records)]  # (one scheduler query for all; ended jobs fetched)
    fetch_remote([r for r, state in zip(records, states) if not state.final])  # the others' metrics so far
    shared, labels = split_overrides(records)
    return report.report(root, records, [job_num(r) for r in records], labels, shared, states,
                         Path(args.out) if args.out else root / "report")


# ----------------------------------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    usage, about = __doc__.split("\n\n")[1:3]
    parser = argparse.ArgumentParser(prog="automodel-hydra", formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description="Run a config file, and operate runs and sweeps after launch."
                                                 "\n\n" + usage,
                                     epilog=about.replace("``", ""))
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    latest = "run or sweep dir (default: the newest under ./outputs and ./multirun)"
    p = sub.add_parser("runs", help="past runs and sweeps under ./outputs and ./multirun, newest first")
    p.add_argument("--limit", type=int, default=20, help="show at most N (default 20; 0 = all)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=cmd_runs)
    p = sub.add_parser("status", help="one row per job with its state from the scheduler")
    p.add_argument("dir", nargs="?", help=latest)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("logs", help="follow a job's log until it ends")
    p.add_argument("dir", nargs="?", help=latest)
    p.add_argument("job", nargs="?", type=int, help="job number (needed when DIR is a sweep of several jobs)")
    p.add_argument("--no-follow", action="store_true", help="print the log and exit")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between reads when following (default 1)")
    p.set_defaults(func=cmd_logs)
    p = sub.add_parser("cancel", help="cancel every job of DIR, or job number JOB")
    p.add_argument("dir", help="run or sweep dir")
    p.add_argument("job", nargs="?", type=int, help="job number (default: every job)")
    p.set_defaults(func=cmd_cancel)
    p = sub.add_parser("resume", help="run a sweep's failed, cancelled and never started members again")
    p.add_argument("dir", help="sweep dir")
    p.set_defaults(func=cmd_resume)
    p = sub.add_parser("report", help="final metrics per job, a PNG of loss curves and what failures cost")
    p.add_argument("dir", nargs="?", help=latest)
    p.add_argument("--out", default=None, help="output dir (default: DIR/report)")
    p.set_defaults(func=cmd_report)
    return parser


def _ft_note(record: Record, state: JobState) -> str:
    """What fault tolerance recorded in the job dir in its current launch (every launcher whose ranks write
    there): ``"restarted 1x: rank 1 hung at step 5"``, and for a failed job the hang that ended it."""
    from automodel_hydra import fault_tolerance

    launch = Path(record["job_dir"]) / "launch"
    if not fault_tolerance.evidence_dir(launch).is_dir():
        return ""
    hang = fault_tolerance.final_hang(launch) if state is JobState.FAILED else None
    return "; ".join(x for x in (hang, fault_tolerance.restart_summary(launch)) if x)


def _excluded_note(record: Record) -> str:
    """The nodes a sweep's other member left out of this job while it was pending (:mod:`automodel_hydra.retry`):
    ``"node1 excluded after 53_0's comm failure"``; "" when none."""
    from automodel_hydra import ledger

    return ledger.inherited_note(Path(record["job_dir"]) / LAUNCH_DIR)


def _note(record: Record, state: JobState, reason: str) -> str:
    """The scheduler's reason next to a pending job, flagged when it means the job will not start as submitted (its
    backend's :meth:`~automodel_hydra.plan.Backend.pending_note`)."""
    from automodel_hydra import backends

    if not reason or state is not JobState.PENDING:
        return reason
    try:
        return backends.get(str(record.get("backend"))).pending_note(reason)
    except UserError:  # a record of no backend of ours
        return reason


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from automodel_hydra import argv as argv_shapes
    from automodel_hydra import streams

    # `status DIR | head -1`, `report DIR | head`: a reader that goes away costs the rest of the output, never the
    # command's own work (report's files) nor its exit status (rich answers a broken pipe with SystemExit(1))
    streams.best_effort()

    if argv and argv[0] not in _SUBCOMMANDS and argv_shapes.is_automodel_cli(argv):  # automodel-hydra cfg.yaml ...
        return launch_file(argv)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:  # CliError, and a backend's PreflightError (no sacct here, say)
        print(f"error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT


#: This CLI's own commands; anything else with a config file is one of AutoModel's CLI shapes.
_SUBCOMMANDS = ("runs", "status", "logs", "cancel", "resume", "report")


def launch_file(args: list[str]) -> int:
    """``automodel-hydra F.yaml [overrides]`` and AutoModel's other CLI shapes: ``python train.py`` on the file,
    unchanged (:func:`automodel_hydra.argv.from_automodel_cli`). A shape that cannot mean here what it meant in
    AutoModel: one line, status 2."""
    from automodel_hydra import argv

    try:
        args = argv.from_automodel_cli(args)
    except argv.UsageError as e:  # a missing file included (argv.NoConfigFile)
        print(f"error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT
    os.execv(sys.executable, [sys.executable, "-m", "automodel_hydra.train", *args])


if __name__ == "__main__":
    sys.exit(main())
