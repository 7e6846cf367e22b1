"""``automodel-hydra``: run a config file (AutoModel's CLI shapes), and operate runs and sweeps after launch.

    automodel-hydra FILE.yaml [--a.b=c] [-m a.b=x,y]   run FILE (an AutoModel YAML as it is) on our launchers
    automodel-hydra finetune llm -c FILE.yaml [--nproc-per-node N]   AutoModel's older CLI (kd|benchmark, vlm)
    automodel-hydra FILE.yaml --help        the file's launchers, keys and commands
    automodel-hydra runs                    past runs and sweeps here: dir, launcher, jobs, states, when
    automodel-hydra status [DIR]            one row per job: number, overrides, backend, job id(s), state
    automodel-hydra logs [DIR] [JOB]        follow a job's log until the job ends (--no-follow: print and exit)
    automodel-hydra cancel DIR [JOB]        cancel every job of DIR, or job number JOB
    automodel-hydra report [DIR]            final metrics per job, and loss curves in DIR/report/loss.png

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
import csv
import dataclasses
import datetime
import json
import os
import sys
import time
import typing as tp
from pathlib import Path

from automodel_hydra import version_line
from automodel_hydra.plan import LAUNCH_DIR, MANIFEST_FILE, RECORD_FILE, RESULT_FILE, launch_dir
from automodel_hydra.schema import UserError
from automodel_hydra.states import JobState

Record = dict[str, tp.Any]

_STYLE = {JobState.COMPLETED: "green", JobState.RUNNING: "cyan", JobState.PENDING: "dim",
          JobState.FAILED: "bold red", JobState.TIMEOUT: "red", JobState.OUT_OF_MEMORY: "red",
          JobState.NODE_FAIL: "red", JobState.BOOT_FAIL: "red", JobState.DEADLINE: "red",
          JobState.CANCELLED: "yellow", JobState.PREEMPTED: "yellow", JobState.UNKNOWN: "magenta"}

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
    manifest, single = launch_dir(root) / MANIFEST_FILE, launch_dir(root) / RECORD_FILE
    if manifest.is_file():
        records = json.loads(manifest.read_text())["jobs"]
    elif single.is_file():
        records = [json.loads(single.read_text())]
    else:
        records = [json.loads(p.read_text()) for p in root.glob(f"*/{LAUNCH_DIR}/{RECORD_FILE}")]
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


def _launch_record(d: Path, sweep: bool) -> float | None:
    """mtime of ``d``'s launch record (a sweep without a manifest: its newest job record), None without one."""
    paths = [launch_dir(d) / MANIFEST_FILE, launch_dir(d) / RECORD_FILE]
    if sweep:
        paths += list(d.glob(f"*/{LAUNCH_DIR}/{RECORD_FILE}"))
    times = [p.stat().st_mtime for p in paths if p.is_file()]
    return max(times) if times else None


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
            sweep = (d / "multirun.yaml").is_file() or (launch_dir(d) / MANIFEST_FILE).is_file()
            if sweep or launch_dir(d).is_dir() or (d / ".hydra").is_dir():
                mtime = _launch_record(d, sweep)
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


def _console() -> tp.Any:
    from rich.console import Console

    # piped: as wide as the rows need, so that each row stays one line (greppable)
    return Console() if sys.stdout.isatty() else Console(width=1000)


def job_ids(record: Record) -> list[str]:
    """The job's ids: the record's, or (a local job, whose pid is written just after its record) its reference's."""
    ids = [str(i) for i in record.get("job_ids") or []]
    if not ids and record.get("backend") == "interactive":
        from automodel_hydra import backends

        ids = list(getattr(backends.get("interactive").ref_from_record(record), "ids", None) or [])
    return ids


def split_overrides(records: list[Record]) -> tuple[list[str], dict[int, str]]:
    """The overrides every job shares, and per job the ones that vary (what tells the jobs of a sweep apart)."""
    sets = [set(r.get("overrides", [])) for r in records]
    common = set.intersection(*sets) if len(sets) > 1 else set()
    shared = [o for o in records[0].get("overrides", []) if o in common]
    return shared, {job_num(r): " ".join(o for o in r.get("overrides", []) if o not in common) or "-" for r in records}


def varied_keys(records: list[Record]) -> list[str]:
    """The override keys whose values differ between the jobs (``optim.lr``, ``seed``), in first-seen order; a key
    that only some jobs set counts as varied."""
    per_job = [{o.partition("=")[0].lstrip("+~"): o.partition("=")[2] for o in r.get("overrides", [])}
               for r in records]
    keys = list(dict.fromkeys(k for job in per_job for k in job))
    return [k for k in keys if len({job.get(k) for job in per_job}) > 1]


def _table(title: str, shared: list[str]) -> tp.Any:
    from rich.table import Table
    from rich.text import Text

    caption = Text(f"every job: {' '.join(shared)}") if shared else None
    return Table(title=Text(title), title_justify="left", caption=caption, caption_justify="left")


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

    table = _table(f"{len(rows)} newest run(s)/sweep(s) under {Path.cwd()}", [])
    for name in ("dir", "kind", "launcher", "jobs", "states", "when"):
        table.add_column(name, no_wrap=True, justify="right" if name == "jobs" else "left")
    for r in rows:
        table.add_row(Text(r["dir"]), r["kind"], r["launcher"], str(r["jobs"]), Text(r["_summary"]), r["when"])
    _console().print(table)
    return 0


def fetch_remote(records: list[Record]) -> None:
    """Bring back what jobs submitted through ``slurm.tunnel`` wrote (results, metrics, logs), so that what is
    read here is what the jobs wrote there; a login node that cannot be reached leaves the copies as they are."""
    remote = [r for r in records if (r.get("ref") or {}).get("remote")]
    if remote:
        from automodel_hydra.backends.slurm import fetch_records

        fetch_records(remote)


def remote_reader(record: Record) -> tp.Callable[[int], tuple[int, bytes] | None] | None:
    """Reads the log of a job submitted through ``slurm.tunnel`` on its login node; None for any other job."""
    if not (record.get("ref") or {}).get("remote"):
        return None
    from automodel_hydra.backends.slurm import Slurm, _remote_reader

    return _remote_reader(Slurm().ref_from_record(record))


def cmd_status(args: argparse.Namespace) -> int:
    from automodel_hydra.progress import backend_states

    root = resolve_dir(args.dir)
    records = load_records(root)
    fetch_remote(records)
    shared, varying = split_overrides(records)
    rows = []
    for rec, info in zip(records, backend_states(records)):
        rows.append({"job": job_num(rec), "overrides": rec.get("overrides", []), "backend": rec["backend"],
                     # the scheduler's name for it (sbatch --job-name, SkyPilot's task name; locally Hydra's)
                     "name": rec.get("job_name") or "-",
                     "job_ids": job_ids(rec), "state": info.state.value,
                     "note": "; ".join(x for x in (_note(info.state, info.reason), _ft_note(rec, info.state)) if x),
                     "job_dir": rec["job_dir"]})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.text import Text  # plain text, never markup: overrides may hold "[...]"

    table = _table(f"{root}: {len(rows)} job(s)", shared)
    columns = ("job", "overrides", "backend", "name", "id", "state")
    for name in columns:
        table.add_column(name, no_wrap=name != "overrides", justify="right" if name == "job" else "left")
    if any(r["note"] for r in rows):
        table.add_column("note")
    for r in rows:
        cells = [str(r["job"]), varying[r["job"]], r["backend"], r["name"], ",".join(r["job_ids"]) or "-"]
        notes = [r["note"]] if len(table.columns) > len(columns) else []
        state = JobState(r["state"])
        table.add_row(*map(Text, cells), Text(state.value, style=_STYLE.get(state, "")), *map(Text, notes))
    _console().print(table)
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
    return follow(path, rec, follow_=not args.no_follow, poll_s=args.poll, read=remote_reader(rec))


def _read_local(path: Path) -> tp.Callable[[int], tuple[int, bytes] | None]:
    def read(pos: int) -> tuple[int, bytes] | None:
        if not path.is_file():
            return None
        if path.stat().st_size < pos:  # truncated or replaced (a requeued job): start over
            pos = 0
        with path.open("rb") as f:
            f.seek(pos)
            return pos, f.read()

    return read


def follow(path: Path, record: Record, *, follow_: bool = True, poll_s: float = 1.0,
           out: tp.TextIO | None = None, read: tp.Callable[[int], tuple[int, bytes] | None] | None = None) -> int:
    """Print ``path``; when following, keep printing what is appended until the job reaches a final state.
    ``read(pos)``: the log's bytes from ``pos`` as ``(offset, data)``, None while there is none (default: the
    local file; a job of ``slurm.tunnel``: its log on the login node)."""
    out = out or sys.stdout
    read = read or _read_local(path)
    pos, state, checked, seen = 0, None, 0.0, False
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
                state, checked = job_state(record)[0], time.monotonic()
                continue  # one more read after a final state, so no trailing line is lost
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return 130
    if not seen:
        print(f"no log yet at {path} (job {job_num(record)}: {(state or job_state(record)[0]).value})",
              file=sys.stderr)
        return 1
    if follow_ and state is not None:
        print(f"-- job {job_num(record)} ended {state.value} (log: {path})", file=sys.stderr)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from automodel_hydra import backends

    for rec in select(load_records(resolve_dir(args.dir)), args.job):
        state, _ = job_state(rec)
        impl = backends.get(rec["backend"])
        ref = impl.ref_from_record(rec)
        what = f"job {job_num(rec)} ({rec['backend']} {','.join(job_ids(rec)) or '-'})"
        if state.final:
            print(f"{what}: already {state.value}, nothing to cancel")
            continue
        impl.cancel([ref])
        print(f"{what}: was {state.value}, cancel requested")
    return 0


# ----------------------------------------------------------------------------------------------- report


def read_metrics(job_dir: Path) -> list[dict[str, tp.Any]]:
    """The rows of ``metrics.jsonl`` (a torn last line from a crashed job is skipped)."""
    path = Path(job_dir) / "metrics.jsonl"
    rows = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


@dataclasses.dataclass
class Curve:
    """One job's logged losses: every logged step with a finite training loss, and the steps with a validation
    loss."""

    steps: list[int]
    losses: list[float]
    val_steps: list[int]
    val_losses: list[float]
    #: the first step logged after each in-job restart (fault tolerance: ``launch/ft/attempts.jsonl``)
    restarts: list[int] = dataclasses.field(default_factory=list)


def curve(metrics: list[dict[str, tp.Any]]) -> Curve:
    """Every row of ``metrics.jsonl`` as a curve (rows whose loss is null, i.e. not finite, are left out)."""
    train = [(m["step"], m["loss"]) for m in metrics if isinstance(m.get("loss"), (int, float))]
    val = [(m["step"], m["val_loss"]) for m in metrics if isinstance(m.get("val_loss"), (int, float))]
    return Curve([s for s, _ in train], [v for _, v in train], [s for s, _ in val], [v for _, v in val])


def restart_steps(metrics: list[dict[str, tp.Any]], job_dir: Path) -> list[int]:
    """The first step logged after each in-job restart of the job (by time: the restarted attempt's rank 0 records
    when it started, :func:`automodel_hydra.fault_tolerance.record_attempt`)."""
    from automodel_hydra import fault_tolerance

    steps = []
    for row in fault_tolerance.attempts(Path(job_dir) / "launch"):
        after = [m["step"] for m in metrics if isinstance(m.get("time"), (int, float))
                 and m["time"] >= float(row.get("time", 0))]
        if after:
            steps.append(min(after))
    return steps


def report_title(root: Path, records: list[Record]) -> str:
    """Which run or sweep (its dir) and what varied between its jobs."""
    varied = varied_keys(records)
    what = f"varied: {', '.join(varied)}" if varied else ("1 job" if len(records) == 1 else "no override varied")
    return f"{root.resolve()}\n{len(records)} job(s); {what}"


def cmd_report(args: argparse.Namespace) -> int:
    root = resolve_dir(args.dir)
    records = load_records(root)
    fetch_remote(records)
    out_dir = Path(args.out) if args.out else root / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    shared, labels = split_overrides(records)
    rows, curves = [], {}
    for rec in records:
        job_dir = Path(rec["job_dir"])
        metrics = read_metrics(job_dir)
        result_file = job_dir / RESULT_FILE
        result = json.loads(result_file.read_text()) if result_file.is_file() else {}
        last = metrics[-1] if metrics else {}
        vals = [m["val_loss"] for m in metrics if isinstance(m.get("val_loss"), (int, float))]
        rows.append({"job": job_num(rec), "overrides": labels[job_num(rec)],
                     "completed": bool(result), "step": result.get("step", last.get("step")),
                     "loss": result.get("loss", last.get("loss")),
                     "val_loss": result.get("val_loss", vals[-1] if vals else None),
                     "tokens_per_s": result.get("tokens_per_s", last.get("tokens_per_s")),
                     "world_size": result.get("world_size", last.get("world_size"))})
        c = curve(metrics)
        c.restarts = restart_steps(metrics, job_dir)
        if c.steps or c.val_steps:
            curves[f"{job_num(rec)}: {labels[job_num(rec)]}"] = c
    csv_path = out_dir / "final_metrics.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _print_report(str(root), rows, shared)
    if not curves:
        print(f"no metrics.jsonl in any job yet; wrote {csv_path}", file=sys.stderr)
        return 1
    png = plot_losses(curves, out_dir / "loss.png", title=report_title(root, records))
    points = write_curves(curves, out_dir / "curves.csv")
    print(f"wrote {png}, {points} and {csv_path}")
    return 0


def _fmt(value: tp.Any, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)


def _print_report(title: str, rows: list[dict[str, tp.Any]], shared: list[str]) -> None:
    table = _table(f"{title}: final metrics", shared)
    for name in ("job", "overrides", "completed", "step", "loss", "val_loss", "tokens/s", "world_size"):
        table.add_column(name, justify="left" if name == "overrides" else "right", no_wrap=name != "overrides")
    from rich.text import Text

    for r in rows:
        done = Text("yes") if r["completed"] else Text("no", style="red")
        table.add_row(str(r["job"]), Text(r["overrides"]), done, _fmt(r["step"]), _fmt(r["loss"]), _fmt(r["val_loss"]),
                      _fmt(r["tokens_per_s"], ",.0f"), _fmt(r["world_size"]))
    _console().print(table)


def write_curves(curves: dict[str, Curve], path: Path) -> Path:
    """Every plotted point as CSV (``job, step, loss, val_loss``): the numbers behind ``loss.png``."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["job", "step", "loss", "val_loss"])
        for label, c in curves.items():
            val = dict(zip(c.val_steps, c.val_losses))
            train = dict(zip(c.steps, c.losses))
            for step in sorted(set(train) | set(val)):
                writer.writerow([label, step, train.get(step, ""), val.get(step, "")])
    return path


def plot_losses(curves: dict[str, Curve], path: Path, title: str) -> Path:
    """Loss vs step, one colour per job: the training loss at every logged step (a line through all of them), the
    validation loss where there is one (dashed, square markers) and a dotted vertical line where training resumed
    after each in-job restart. Drawn with matplotlib's Agg backend (no display needed); ``title`` is also stored as
    the PNG's ``Title`` text. Raises CliError naming the ``report`` extra when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise CliError("the loss plot needs matplotlib: pip install 'automodel-hydra[report]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(10, 6), layout="constrained")
    for label, c in curves.items():
        (line,) = ax.plot(c.steps, c.losses, label=label, linewidth=1.2,
                          marker="o" if len(c.steps) <= 50 else None, markersize=2.5)
        if c.val_steps:
            ax.plot(c.val_steps, c.val_losses, linestyle="--", marker="s", markersize=4, color=line.get_color(),
                    label=f"{label} (validation)")
        for i, step in enumerate(c.restarts):  # in-job restarts (fault tolerance): where training resumed
            ax.axvline(step, linestyle=":", color=line.get_color(), alpha=0.8,
                       label=f"{label} (in-job restart)" if i == 0 else None)
    has_val = any(c.val_steps for c in curves.values())
    ax.set(xlabel="step", ylabel="loss (nats/token)",
           title=title + ("\ntraining loss (solid), validation loss (dashed)" if has_val else "\ntraining loss"))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if len(curves) <= 20:  # beyond that a legend hides the plot; the CSV names every job
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=120, metadata={"Title": title})
    plt.close(fig)
    return path


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
    p = sub.add_parser("report", help="final metrics per job and a PNG of loss curves")
    p.add_argument("dir", nargs="?", help=latest)
    p.add_argument("--out", default=None, help="output dir (default: DIR/report)")
    p.set_defaults(func=cmd_report)
    return parser


#: squeue(1) REASON codes of a pending job that will not start as submitted (slurm's "JOB REASON CODES").
NEVER_REASONS = ("PartitionConfig", "PartitionDown", "PartitionInactive", "PartitionNodeLimit", "PartitionTimeLimit",
                 "ReqNodeNotAvail", "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed",
                 "BadConstraints", "DependencyNeverSatisfied", "JobHeldAdmin", "AssocMaxJobsLimit")


def _ft_note(record: Record, state: JobState) -> str:
    """What fault tolerance recorded in the job dir in its current launch (every launcher whose ranks write
    there): ``"restarted 1x: rank 1 hung at step 5"``, and for a failed job the hang that ended it."""
    from automodel_hydra import fault_tolerance

    launch = Path(record["job_dir"]) / "launch"
    if not fault_tolerance.evidence_dir(launch).is_dir():
        return ""
    hang = fault_tolerance.final_hang(launch) if state is JobState.FAILED else None
    return "; ".join(x for x in (hang, fault_tolerance.restart_summary(launch)) if x)


def _note(state: JobState, reason: str) -> str:
    """The scheduler's reason next to a pending job, flagged when it means the job will not start as submitted."""
    if not reason:
        return ""
    if state is JobState.PENDING and reason.startswith(NEVER_REASONS):
        return f"{reason} (will not start as submitted: fix the request, e.g. partition/account/QOS, and resubmit)"
    return reason


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from automodel_hydra import argv as argv_shapes

    if argv and argv[0] not in _SUBCOMMANDS and argv_shapes.is_automodel_cli(argv):  # automodel-hydra cfg.yaml ...
        return launch_file(argv)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:  # CliError, and a backend's PreflightError (no sacct here, say)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `automodel-hydra status DIR | head`
        sys.stderr.close()
        return 0


#: This CLI's own commands; anything else with a config file is one of AutoModel's CLI shapes.
_SUBCOMMANDS = ("runs", "status", "logs", "cancel", "report")


def launch_file(args: list[str]) -> int:
    """``automodel-hydra F.yaml [overrides]`` and AutoModel's other CLI shapes: ``python train.py`` on the file,
    unchanged (:func:`automodel_hydra.argv.from_automodel_cli`). A shape that cannot mean here what it meant in
    AutoModel: one line, status 2."""
    from automodel_hydra import argv

    try:
        args = argv.from_automodel_cli(args)
    except argv.UsageError as e:  # a missing file included (argv.NoConfigFile)
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.execv(sys.executable, [sys.executable, "-m", "automodel_hydra.train", *args])


if __name__ == "__main__":
    sys.exit(main())
