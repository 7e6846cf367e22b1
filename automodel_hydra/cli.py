"""``automodel-hydra``: operate runs and sweeps after launch.

    automodel-hydra status DIR              one row per job: number, overrides, backend, job id(s), state
    automodel-hydra logs DIR [JOB]          follow a job's log until the job ends (--no-follow: print and exit)
    automodel-hydra cancel DIR [JOB]        cancel every job of DIR, or job number JOB
    automodel-hydra report DIR              final metrics per job, and loss curves in DIR/report/loss.png

DIR is a run dir (``launch/submission.json``) or a sweep dir (``launch/manifest.json``; without one, its jobs'
``*/launch/submission.json``). States come from each job's backend (``status(record)``: sacct/squeue for Slurm,
SkyPilot's job queue, the process and its ``result.json`` locally) and use Slurm's names; a state the backend
cannot determine is shown as UNKNOWN, never guessed.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
import typing as tp
from pathlib import Path

Record = dict[str, tp.Any]

_STYLE = {"COMPLETED": "green", "RUNNING": "cyan", "PENDING": "dim", "CANCELLED": "yellow", "UNKNOWN": "magenta"}


class CliError(Exception):
    """A mistake the user can fix; printed as one line, exit status 2."""


# ----------------------------------------------------------------------------------------------- records


def load_records(path: str | Path) -> list[Record]:
    """The submission records of a run or sweep dir, ordered by job number."""
    root = Path(path)
    manifest, single = root / "launch" / "manifest.json", root / "launch" / "submission.json"
    if manifest.is_file():
        records = json.loads(manifest.read_text())["jobs"]
    elif single.is_file():
        records = [json.loads(single.read_text())]
    else:
        records = [json.loads(p.read_text()) for p in root.glob("*/launch/submission.json")]
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


def job_state(record: Record) -> tuple[str, str]:
    """``(state, note)`` from the job's backend; ``("UNKNOWN", why)`` when the backend cannot tell."""
    from automodel_hydra.progress import backend_states

    info = backend_states([record])[0]
    return info.state.value, info.reason


def _console() -> tp.Any:
    from rich.console import Console

    # piped: as wide as the rows need, so that each row stays one line (greppable)
    return Console() if sys.stdout.isatty() else Console(width=1000)


def _ids(record: Record) -> str:
    return ",".join(map(str, record.get("job_ids") or [])) or "-"


def split_overrides(records: list[Record]) -> tuple[list[str], dict[int, str]]:
    """The overrides every job shares, and per job the ones that vary (what tells the jobs of a sweep apart)."""
    sets = [set(r.get("overrides", [])) for r in records]
    common = set.intersection(*sets) if len(sets) > 1 else set()
    shared = [o for o in records[0].get("overrides", []) if o in common]
    return shared, {job_num(r): " ".join(o for o in r.get("overrides", []) if o not in common) or "-" for r in records}


def _table(title: str, shared: list[str]) -> tp.Any:
    from rich.table import Table
    from rich.text import Text

    caption = Text(f"every job: {' '.join(shared)}") if shared else None
    return Table(title=Text(title), title_justify="left", caption=caption, caption_justify="left")


# ----------------------------------------------------------------------------------------------- commands


def cmd_status(args: argparse.Namespace) -> int:
    from automodel_hydra.progress import backend_states

    records = load_records(args.dir)
    shared, varying = split_overrides(records)
    rows = []
    for rec, info in zip(records, backend_states(records)):
        state, note = info.state.value, info.reason
        rows.append({"job": job_num(rec), "overrides": rec.get("overrides", []), "backend": rec["backend"],
                     "job_ids": rec.get("job_ids") or [], "state": state, "note": note, "job_dir": rec["job_dir"]})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.text import Text  # plain text, never markup: overrides may hold "[...]"

    table = _table(f"{args.dir}: {len(rows)} job(s)", shared)
    for name in ("job", "overrides", "backend", "id", "state"):
        table.add_column(name, no_wrap=name != "overrides", justify="right" if name == "job" else "left")
    if any(r["note"] for r in rows):
        table.add_column("note")
    for r in rows:
        cells = [str(r["job"]), varying[r["job"]], r["backend"], ",".join(r["job_ids"]) or "-"]
        notes = [r["note"]] if len(table.columns) > 5 else []
        table.add_row(*map(Text, cells), Text(r["state"], style=_STYLE.get(r["state"], "bold red")), *map(Text, notes))
    _console().print(table)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    records = select(load_records(args.dir), args.job)
    if len(records) > 1:
        raise CliError(f"{args.dir} has {len(records)} jobs; name one: automodel-hydra logs {args.dir} JOB "
                       f"(JOB in {', '.join(str(job_num(r)) for r in records)})")
    rec = records[0]
    path = Path(rec.get("log_path") or Path(rec["job_dir"]) / f"{rec['job_name']}.log")
    return follow(path, rec, follow_=not args.no_follow, poll_s=args.poll)


def follow(path: Path, record: Record, *, follow_: bool = True, poll_s: float = 1.0,
           out: tp.TextIO | None = None) -> int:
    """Print ``path``; when following, keep printing what is appended until the job reaches a final state."""
    from automodel_hydra.states import JobState

    out = out or sys.stdout
    pos, state, checked = 0, "", 0.0
    try:
        while True:
            if path.is_file():
                if path.stat().st_size < pos:  # truncated or replaced (a requeued job): start over
                    pos = 0
                with path.open("rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                pos += len(chunk)
                if chunk:
                    out.write(chunk.decode(errors="replace"))
                    out.flush()
            if not follow_ or (state and JobState(state).final):
                break
            if time.monotonic() - checked >= max(poll_s, 2.0):
                state, checked = job_state(record)[0], time.monotonic()
                continue  # one more read after a final state, so no trailing line is lost
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return 130
    if not path.is_file():
        print(f"no log yet at {path} (job {job_num(record)}: {state or job_state(record)[0]})", file=sys.stderr)
        return 1
    if follow_:
        print(f"-- job {job_num(record)} ended {state} (log: {path})", file=sys.stderr)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from automodel_hydra import backends
    from automodel_hydra.states import JobState

    for rec in select(load_records(args.dir), args.job):
        state, _ = job_state(rec)
        what = f"job {job_num(rec)} ({rec['backend']} {_ids(rec)})"
        if JobState(state).final:
            print(f"{what}: already {state}, nothing to cancel")
            continue
        impl = backends.get(rec["backend"])
        impl.cancel([impl.ref_from_record(rec)])
        print(f"{what}: was {state}, cancel requested")
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




def cmd_report(args: argparse.Namespace) -> int:
    records = load_records(args.dir)
    out_dir = Path(args.out) if args.out else Path(args.dir) / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    shared, labels = split_overrides(records)
    rows, curves = [], {}
    for rec in records:
        job_dir = Path(rec["job_dir"])
        metrics = read_metrics(job_dir)
        result_file = job_dir / "result.json"
        result = json.loads(result_file.read_text()) if result_file.is_file() else {}
        last = metrics[-1] if metrics else {}
        rows.append({"job": job_num(rec), "overrides": labels[job_num(rec)],
                     "completed": bool(result), "step": result.get("step", last.get("step")),
                     "loss": result.get("loss", last.get("loss")), "val_loss": result.get("val_loss"),
                     "tokens_per_s": result.get("tokens_per_s", last.get("tokens_per_s")),
                     "world_size": result.get("world_size", last.get("world_size"))})
        if metrics:
            curves[f"{job_num(rec)}: {labels[job_num(rec)]}"] = ([m["step"] for m in metrics], [m["loss"] for m in metrics])
    csv_path = out_dir / "final_metrics.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _print_report(args.dir, rows, shared)
    if not curves:
        print(f"no metrics.jsonl in any job yet; wrote {csv_path}", file=sys.stderr)
        return 1
    png = plot_losses(curves, out_dir / "loss.png", title=f"{Path(args.dir).resolve().name}: training loss")
    print(f"wrote {png} and {csv_path}")
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


def plot_losses(curves: dict[str, tuple[list[int], list[float]]], path: Path, title: str) -> Path:
    """Loss vs step, one line per job, drawn with matplotlib's Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(9, 5.5), layout="constrained")
    for label, (steps, losses) in curves.items():
        ax.plot(steps, losses, label=label, marker="o" if len(steps) <= 20 else None, markersize=3)
    ax.set(xlabel="step", ylabel="training loss", title=title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if len(curves) <= 20:  # beyond that a legend hides the plot; the CSV names every job
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    usage, about = __doc__.split("\n\n")[1:3]
    parser = argparse.ArgumentParser(prog="automodel-hydra", formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description="Operate runs and sweeps after launch.\n\n" + usage,
                                     epilog=about.replace("``", ""))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("status", help="one row per job with its state from the scheduler")
    p.add_argument("dir", help="run or sweep dir")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("logs", help="follow a job's log until it ends")
    p.add_argument("dir", help="run or sweep dir")
    p.add_argument("job", nargs="?", type=int, help="job number (needed when DIR is a sweep of several jobs)")
    p.add_argument("--no-follow", action="store_true", help="print the log and exit")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between reads when following (default 1)")
    p.set_defaults(func=cmd_logs)
    p = sub.add_parser("cancel", help="cancel every job of DIR, or job number JOB")
    p.add_argument("dir", help="run or sweep dir")
    p.add_argument("job", nargs="?", type=int, help="job number (default: every job)")
    p.set_defaults(func=cmd_cancel)
    p = sub.add_parser("report", help="final metrics per job and a PNG of loss curves")
    p.add_argument("dir", help="run or sweep dir")
    p.add_argument("--out", default=None, help="output dir (default: DIR/report)")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `automodel-hydra status DIR | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
