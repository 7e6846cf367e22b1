"""``automodel-hydra report DIR``: what a run's or sweep's outputs tell once it ran, printed and written under
``DIR/report/``:

* the final metrics of each job (``final_metrics.csv``);
* the loss curves (``loss.png``, its points in ``curves.csv``), marking where training went on after an in-job
  restart, a Slurm requeue or another resume; from ``metrics.jsonl`` or an AutoModel recipe's own records;
* what failures cost: every attempt of every job (``attempts.csv``: class, node, start, end, step reached, steps
  and seconds lost, decision; the ledger of :mod:`automodel_hydra.ledger`, the numbers ``status --json`` gives),
  printed for the jobs with more than one attempt or a failed one; and for a sweep one summary
  (``failure_costs.csv``: attempts by class, steps and seconds lost, the sweep's goodput).

The caller (:mod:`automodel_hydra.cli`) finds the dir, its records and their states; this module reads the job
dirs and imports matplotlib only to draw.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import sys
import typing as tp
from pathlib import Path

from automodel_hydra import display
from automodel_hydra.plan import JOB_FILE, LAUNCH_DIR, RESULT_FILE
from automodel_hydra.schema import UserError
from automodel_hydra.states import JobState

Record = dict[str, tp.Any]


class ReportError(UserError):
    """A report that cannot be made as asked (matplotlib missing); one line, exit status 2."""


# ----------------------------------------------------------------------------------------------- curves


def read_metrics(job_dir: Path) -> list[dict[str, tp.Any]]:
    """The rows of ``metrics.jsonl`` (a torn last line from a crashed job is skipped)."""
    from automodel_hydra.metrics import METRICS_FILE, read_records

    return read_records(Path(job_dir) / METRICS_FILE)


@dataclasses.dataclass
class Curve:
    """One job's logged losses: every logged step with a finite training loss, and the steps with a validation
    loss; ``more_val``: AutoModel's named validation sets (``validation_<name>.jsonl``), name -> (steps, losses)."""

    steps: list[int]
    losses: list[float]
    val_steps: list[int]
    val_losses: list[float]
    #: the first step logged after each in-job restart (the records' ``restart`` field; fault tolerance's
    #: ``launch/ft/attempts.jsonl`` by time)
    restarts: list[int] = dataclasses.field(default_factory=list)
    #: the first step logged after each Slurm requeue (the records' ``requeue`` field)
    requeues: list[int] = dataclasses.field(default_factory=list)
    #: where a recipe that keeps its own records (AutoModel's ``training.jsonl``) resumed from a checkpoint: the
    #: first step it logged again, when no restart or requeue above explains it
    resumes: list[int] = dataclasses.field(default_factory=list)
    more_val: dict[str, tuple[list[int], list[float]]] = dataclasses.field(default_factory=dict)


def number(value: tp.Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def curve(metrics: list[dict[str, tp.Any]]) -> Curve:
    """Every row of ``metrics.jsonl`` as a curve (rows whose loss is null, i.e. not finite, are left out)."""
    train = [(m["step"], m["loss"]) for m in metrics if number(m.get("loss")) and number(m.get("step"))]
    val = [(m["step"], m["val_loss"]) for m in metrics if number(m.get("val_loss")) and number(m.get("step"))]
    return Curve([s for s, _ in train], [v for _, v in train], [s for s, _ in val], [v for _, v in val])


def attempt_steps(rows: list[dict[str, tp.Any]], field: str, *, later: bool = True) -> list[int]:
    """The first step each new attempt logged: where the record's ``field`` (``restart`` or ``requeue``,
    :data:`automodel_hydra.metrics.ATTEMPT_FIELDS`; absent = 0) grows from the record before (``later=False``:
    where it falls back, i.e. a new launch of the job dir after a restarted or requeued one)."""
    steps, before = [], 0
    for row in rows:
        now = row.get(field, 0)
        if number(now) and number(row.get("step")) and (now > before if later else now < before):
            steps.append(int(row["step"]))
        before = now if number(now) else before
    return steps


def restart_steps(metrics: list[dict[str, tp.Any]], job_dir: Path) -> list[int]:
    """The first step logged after each in-job restart of the job (by time: the restarted attempt's rank 0 records
    when it started, :func:`automodel_hydra.fault_tolerance.record_attempt`)."""
    from automodel_hydra import fault_tolerance

    steps = []
    for row in fault_tolerance.attempts(Path(job_dir) / "launch"):
        after = [m["step"] for m in metrics if number(m.get("time")) and number(m.get("step"))
                 and m["time"] >= float(row.get("time", 0))]
        if after:
            steps.append(min(after))
    return steps


def automodel_log_dir(job_dir: Path) -> Path | None:
    """Where a job's AutoModel recipe writes ``training.jsonl`` and ``validation*.jsonl``, from the job's
    ``launch/job.yaml`` (:func:`automodel_hydra.recipe_kind.metrics_dir`); None for the bundled recipe, a dir only
    the ranks can resolve (``${VAR}``), or no spec."""
    import yaml

    from automodel_hydra.recipe_kind import metrics_dir

    try:  # libyaml's loader where PyYAML has it: status reads one spec per job of a sweep
        spec = yaml.load((Path(job_dir) / LAUNCH_DIR / JOB_FILE).read_text(),
                         Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError):
        return None
    return metrics_dir(spec, Path(job_dir)) if isinstance(spec, dict) else None


#: AutoModel's JSON Lines records of a run, in its checkpoint dir (``recipes/llm/train_ft.py``, 0.7.0): one per
#: logged training step, and per validation (``validation_<name>.jsonl`` for a named validation set).
AUTOMODEL_TRAINING, AUTOMODEL_VALIDATION = "training.jsonl", "validation.jsonl"


def automodel_curve(log_dir: Path, job_dir: Path) -> Curve:
    """An AutoModel recipe's own records as a curve. AutoModel appends to its files, so a job that resumed from a
    checkpoint (requeued, restarted, launched again) logged the steps after that checkpoint twice: each step keeps
    its last record, and the first step logged again is a resume. In-job restarts come from fault tolerance's
    record (by time: the records' ``timestamp``, ISO 8601)."""
    def by_step(rows: list[dict[str, tp.Any]], field: str) -> tuple[list[int], list[float], list[int]]:
        kept: dict[int, float] = {}
        again: list[int] = []
        last: int | None = None
        for row in rows:
            if not number(row.get("step")):
                continue
            step = int(row["step"])
            if last is not None and step <= last:
                again.append(step)
            last = step
            if number(row.get(field)):
                kept[step] = float(row[field])
        steps = sorted(kept)
        return steps, [kept[s] for s in steps], again

    from automodel_hydra.metrics import read_records

    train = read_records(log_dir / AUTOMODEL_TRAINING)
    steps, losses, again = by_step(train, "loss")
    val_steps, val_losses, _ = by_step(read_records(log_dir / AUTOMODEL_VALIDATION), "val_loss")
    c = Curve(steps, losses, val_steps, val_losses)
    for path in sorted(log_dir.glob("validation_*.jsonl")):
        named = by_step(read_records(path), "val_loss")
        if named[0]:
            c.more_val[path.stem.removeprefix("validation_")] = (named[0], named[1])
    timed = [{"step": row.get("step"), "time": _epoch(row.get("timestamp"))} for row in train]
    c.restarts = restart_steps([r for r in timed if r["time"] is not None], job_dir)
    c.resumes = [s for s in again if s not in c.restarts]
    return c


def _epoch(stamp: tp.Any) -> float | None:
    """An ISO 8601 time stamp (AutoModel's ``2026-12-04T10:00:00.123Z``) in seconds since the epoch."""
    try:
        return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def last_logged(job_dir: Path) -> dict[str, tp.Any] | None:
    """The job's last logged step, whichever recipe logged it (``metrics.jsonl``, else an AutoModel recipe's
    ``training.jsonl``); None before its first step."""
    from automodel_hydra.metrics import METRICS_FILE, last_record

    row = last_record(Path(job_dir) / METRICS_FILE)
    if row is None:
        log_dir = automodel_log_dir(job_dir)
        row = last_record(log_dir / AUTOMODEL_TRAINING) if log_dir is not None else None
    return row if row is not None and number(row.get("step")) else None


def job_curve(job_dir: Path) -> tuple[Curve, list[dict[str, tp.Any]]]:
    """The job's curve and the rows it came from, whichever recipe logged them: ``metrics.jsonl`` (the bundled
    recipe, a function's ``dist.log``), else an AutoModel recipe's own records (:func:`automodel_curve`)."""
    from automodel_hydra.metrics import RESUMED_FIELD

    rows = read_metrics(job_dir)
    if rows:
        c = curve(rows)
        c.restarts = sorted(set(attempt_steps(rows, "restart")) | set(restart_steps(rows, job_dir)))
        c.requeues = attempt_steps(rows, "requeue")
        launches = {int(r["step"]) for r in rows if r.get(RESUMED_FIELD) is True and number(r.get("step"))}
        c.resumes = sorted(({s for f in ("restart", "requeue") for s in attempt_steps(rows, f, later=False)}
                            | launches) - set(c.restarts) - set(c.requeues))
        return c, rows
    log_dir = automodel_log_dir(job_dir)
    if log_dir is None:
        return Curve([], [], [], []), []
    from automodel_hydra.metrics import read_records

    return automodel_curve(log_dir, job_dir), read_records(log_dir / AUTOMODEL_TRAINING)




# ----------------------------------------------------------------------------------------------- final metrics


def varied_keys(records: list[Record]) -> list[str]:
    """The override keys whose values differ between the jobs (``optim.lr``, ``seed``), in first-seen order; a key
    that only some jobs set counts as varied."""
    per_job = [{o.partition("=")[0].lstrip("+~"): o.partition("=")[2] for o in r.get("overrides", [])}
               for r in records]
    keys = list(dict.fromkeys(k for job in per_job for k in job))
    return [k for k in keys if len({job.get(k) for job in per_job}) > 1]


def report_title(root: Path, records: list[Record]) -> str:
    """Which run or sweep (its dir) and what varied between its jobs."""
    varied = varied_keys(records)
    what = f"varied: {', '.join(varied)}" if varied else ("1 job" if len(records) == 1 else "no override varied")
    return f"{root.resolve()}\n{len(records)} job(s); {what}"


def completed(record: Record) -> bool:
    """Whether the job completed in its launch: its result carries the launch id and every rank of its last
    attempt returned (:func:`automodel_hydra.outcome.completed`; a result left by an earlier launch is not this
    one's). A SkyPilot job's result is on its nodes: there, the result copied back counts."""
    from automodel_hydra import backends, outcome
    from automodel_hydra.plan import JobSpec

    job = JobSpec(job_dir=Path(record["job_dir"]), job_name=str(record.get("log_name") or "train"))
    if not backends.get(record["backend"]).ranks_write_job_dir:
        return job.result_file.is_file()
    return outcome.completed(job)


def print_final(title: str, rows: list[dict[str, tp.Any]], shared: list[str]) -> None:
    from rich.text import Text

    table = display.table()
    for name in ("job", "overrides", "completed", "state", "step", "loss", "val_loss", "tokens/s", "world_size"):
        table.add_column(name, justify="left" if name == "overrides" else "right", no_wrap=name != "overrides")
    fmt = display.fmt
    for r in rows:
        done = Text("yes") if r["completed"] else Text("no", style="red")
        state = Text(r["state"], style=display.STYLE.get(JobState(r["state"]), ""))
        table.add_row(str(r["job"]), Text(r["overrides"]), done, state, fmt(r["step"]), fmt(r["loss"]),
                      fmt(r["val_loss"]), fmt(r["tokens_per_s"], ",.0f"), fmt(r["world_size"]))
    display.show(f"{title}: final metrics", table,
                 [f"{'every job' if len(rows) > 1 else 'overrides'}: {' '.join(shared)}"] if shared else [])


# ----------------------------------------------------------------------------------------------- failure costs


def job_attempts(record: Record, state: JobState) -> dict[str, tp.Any]:
    """The job's ledger summary (:func:`automodel_hydra.ledger.of_state`: ``attempts``, ``goodput``, ``kept_s``,
    ``wall_s``, ``excluded``) where its ranks write into its dir here, else {} (a SkyPilot job's are on its
    nodes). What ``status --json`` adds to each row, and what the report's tables show."""
    from automodel_hydra import backends, ledger

    if not getattr(backends.get(record["backend"]), "ranks_write_job_dir", False):  # (as progress.backend_states)
        return {}
    return ledger.of_state(Path(record["job_dir"]) / LAUNCH_DIR, state)


#: The columns of ``attempts.csv``, one row per attempt of every job.
ATTEMPT_COLUMNS = ("job", "attempt", "class", "evidence", "node", "start", "end", "step", "resumed_from",
                   "steps_lost", "seconds_lost", "decision", "excluded")


def _iso(t: float | None) -> str | None:
    """Seconds since the epoch as ISO 8601 in UTC, to the second (``2026-12-07T16:05:09+00:00``)."""
    return None if t is None else datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat("T", "seconds")


def attempt_rows(jobs: tp.Sequence[tuple[int, tp.Mapping[str, tp.Any]]]) -> list[dict[str, tp.Any]]:
    """Every attempt of every job (``(job number, job_attempts)`` pairs) as rows of :data:`ATTEMPT_COLUMNS`."""
    rows = []
    for num, summary in jobs:
        for a in summary.get("attempts") or []:
            rows.append({"job": num, **{k: a.get(k) for k in ATTEMPT_COLUMNS[1:]},
                         "start": _iso(a.get("start")), "end": _iso(a.get("end")),
                         "excluded": " ".join(a.get("excluded") or []) or None})
    return rows


def costly(summary: tp.Mapping[str, tp.Any]) -> bool:
    """Whether a job's attempts are worth a row in the printed table: more than one, or one that failed (a job
    with one clean attempt, or none yet, is said in one line instead)."""
    from automodel_hydra import ledger

    tried = summary.get("attempts") or []
    return len(tried) > 1 or any(a.get("class") not in (ledger.COMPLETED, ledger.RUNNING) for a in tried)


def sweep_costs(jobs: tp.Sequence[tuple[int, tp.Mapping[str, tp.Any]]]) -> dict[str, tp.Any]:
    """One summary of what failures cost a sweep: its jobs, their attempts in all and by class
    (``"completed 3, comm 1"``, most frequent first), the steps and seconds lost in all, and the sweep's goodput:
    the kept steps' wall time of every job over the sum of each job's wall time since its first start
    (:func:`automodel_hydra.ledger.wall_times`; jobs without times left out; None when none has them)."""
    import collections

    tried = [a for _, s in jobs for a in s.get("attempts") or []]
    kinds = collections.Counter(str(a.get("class")) for a in tried)
    timed = [s for _, s in jobs if s.get("kept_s") is not None and s.get("wall_s")]
    wall = sum(float(s["wall_s"]) for s in timed)
    return {"jobs": len(jobs), "attempts": len(tried),
            "by_class": ", ".join(f"{k} {n}" for k, n in kinds.most_common()) or None,
            "failed_attempts": sum(n for k, n in kinds.items() if k not in ("completed", "running")),
            "steps_lost": sum(int(a["steps_lost"]) for a in tried if isinstance(a.get("steps_lost"), int)),
            "seconds_lost": round(sum(float(a["seconds_lost"]) for a in tried
                                      if isinstance(a.get("seconds_lost"), (int, float))), 1),
            "goodput": round(sum(float(s["kept_s"]) for s in timed) / wall, 3) if wall > 0 else None}


def _clock(stamp: str | None) -> str:
    """An ISO time of :func:`_iso` in this machine's local time, ``MM-DD HH:MM:SS``."""
    if stamp is None:
        return "-"
    return datetime.datetime.fromisoformat(stamp).astimezone().strftime("%m-%d %H:%M:%S")


def print_attempts(title: str, rows: list[dict[str, tp.Any]], shown: list[int], jobs: int, csv_path: Path) -> None:
    """The attempts of the jobs in ``shown`` (:func:`costly`), one row each, or one line when there are none."""
    from rich.text import Text

    if not shown:
        print(f"attempts: each of the {jobs} job(s) ran once without a failure (every attempt: {csv_path})")
        return
    table = display.table()
    columns = ("job", "attempt", "class", "node", "start", "end", "step", "steps lost", "s lost", "decision")
    for name in columns:
        table.add_column(name, justify="right" if name in ("job", "step", "steps lost", "s lost") else "left",
                         no_wrap=name != "decision")
    fmt = display.fmt
    for r in (r for r in rows if r["job"] in shown):
        table.add_row(str(r["job"]), r["attempt"], r["class"], fmt(r["node"]), _clock(r["start"]),
                      _clock(r["end"]), fmt(r["step"]), fmt(r["steps_lost"]), fmt(r["seconds_lost"], ".1f"),
                      Text(r["decision"] or "-"))
    rest = jobs - len(shown)
    display.show(f"{title}: attempts of the jobs with more than one attempt or a failed one ({len(shown)} of {jobs})",
                 table, [f"the other {rest} job(s) ran once without a failure (every attempt: {csv_path})"]
                 if rest else [])


def print_sweep_costs(title: str, costs: tp.Mapping[str, tp.Any]) -> None:
    table = display.table()
    for name in ("jobs", "attempts", "by class", "steps lost", "seconds lost", "goodput"):
        table.add_column(name, justify="left" if name == "by class" else "right")
    fmt = display.fmt
    table.add_row(str(costs["jobs"]), str(costs["attempts"]), fmt(costs["by_class"]), fmt(costs["steps_lost"]),
                  fmt(costs["seconds_lost"], ".1f"), fmt(costs["goodput"], ".3f"))
    display.show(f"{title}: what failures cost the sweep", table)


def write_csv(path: Path, rows: tp.Sequence[tp.Mapping[str, tp.Any]], columns: tp.Sequence[str]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)
    return path


# ----------------------------------------------------------------------------------------------- the report


def report(root: Path, records: list[Record], nums: list[int], labels: dict[int, str], shared: list[str],
           states: tp.Sequence[JobState], out_dir: Path) -> int:
    """Print and write the report of ``records`` (job numbers ``nums``, their varying overrides ``labels``,
    the ``shared`` ones, each job's ``states``) into ``out_dir``. Returns 0, or 1 when no job logged a step yet
    (the tables and CSVs are written all the same). Raises ReportError without matplotlib."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, curves, ledgers = [], {}, []
    for num, rec, state in zip(nums, records, states):
        job_dir = Path(rec["job_dir"])
        c, logged = job_curve(job_dir)
        result_file = job_dir / RESULT_FILE
        result = json.loads(result_file.read_text()) if result_file.is_file() else {}
        last = logged[-1] if logged else {}
        rows.append({"job": num, "overrides": labels[num],
                     "completed": completed(rec), "step": result.get("step", last.get("step")),
                     "loss": result.get("loss", c.losses[-1] if c.losses else None),
                     "val_loss": result.get("val_loss", c.val_losses[-1] if c.val_losses else None),
                     "tokens_per_s": result.get("tokens_per_s", last.get("tokens_per_s", last.get("tps"))),
                     "world_size": result.get("world_size", last.get("world_size")), "state": state.value})
        ledgers.append((num, job_attempts(rec, state)))
        if c.steps or c.val_steps:
            curves[f"{num}: {labels[num]}" if labels[num] != "-" else f"job {num}"] = c
    written = [write_csv(out_dir / "final_metrics.csv", rows, list(rows[0]))]
    print_final(str(root), rows, shared)
    tried = attempt_rows(ledgers)
    if tried:
        written.append(write_csv(out_dir / "attempts.csv", tried, ATTEMPT_COLUMNS))
        print_attempts(str(root), tried, [n for n, s in ledgers if costly(s)], len(ledgers), written[-1])
    if len(records) > 1 and tried:
        costs = sweep_costs(ledgers)
        written.append(write_csv(out_dir / "failure_costs.csv", [costs], list(costs)))
        print_sweep_costs(str(root), costs)
    if not curves:
        print(f"no logged step in any job yet (metrics.jsonl: the bundled recipe, a function's dist.log; "
              f"{AUTOMODEL_TRAINING} in an AutoModel recipe's checkpoint dir); wrote "
              f"{', '.join(map(str, written))}", file=sys.stderr)
        return 1
    png = plot_losses(curves, out_dir / "loss.png", title=report_title(root, records))
    points = write_curves(curves, out_dir / "curves.csv")
    print(f"wrote {', '.join(map(str, [png, points, *written]))}")
    return 0


# ----------------------------------------------------------------------------------------------- drawing


def write_curves(curves: dict[str, Curve], path: Path) -> Path:
    """Every plotted point as CSV (``job, step, loss, val_loss``, and ``val_loss_<name>`` per named validation
    set): the numbers behind ``loss.png``."""
    names = list(dict.fromkeys(name for c in curves.values() for name in c.more_val))
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["job", "step", "loss", "val_loss", *(f"val_loss_{n}" for n in names)])
        for label, c in curves.items():
            series = [dict(zip(c.steps, c.losses)), dict(zip(c.val_steps, c.val_losses)),
                      *(dict(zip(*c.more_val.get(n, ([], [])))) for n in names)]
            for step in sorted(set().union(*series)):
                writer.writerow([label, step, *(values.get(step, "") for values in series)])
    return path


def plot_losses(curves: dict[str, Curve], path: Path, title: str) -> Path:
    """Loss vs step, one colour per job: the training loss at every logged step (a line through all of them), the
    validation loss where there is one (dashed, square markers; AutoModel's named validation sets with triangles)
    and a vertical line where training went on after each in-job restart (dotted), Slurm requeue (dash-dot) or
    other resume from a checkpoint (sparse dots). Drawn with matplotlib's Agg backend (no display needed);
    ``title`` is also stored as the PNG's ``Title`` text. Raises ReportError naming the ``report`` extra when
    matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError("the loss plot needs matplotlib: pip install 'automodel-hydra[report]'") from None

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
        for name, (steps, losses) in c.more_val.items():
            ax.plot(steps, losses, linestyle="--", marker="^", markersize=4, color=line.get_color(),
                    label=f"{label} (validation {name})")
        for marks, style, what in ((c.restarts, ":", "in-job restart"), (c.requeues, "-.", "requeue"),
                                   (c.resumes, (0, (1, 4)), "resumed")):
            for i, step in enumerate(marks):  # where training went on after the restart, requeue or resume
                ax.axvline(step, linestyle=style, color=line.get_color(), alpha=0.8,
                           label=f"{label} ({what})" if i == 0 else None)
    has_val = any(c.val_steps or c.more_val for c in curves.values())
    ax.set(xlabel="step", ylabel="loss (nats/token)",
           title=title + ("\ntraining loss (solid), validation loss (dashed)" if has_val else "\ntraining loss"))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if len(curves) <= 20:  # beyond that a legend hides the plot; the CSV names every job
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=120, metadata={"Title": title})
    plt.close(fig)
    return path
