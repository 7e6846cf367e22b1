"""Resuming a sweep: keep its COMPLETED members, run the others again in their own dirs.

``automodel-hydra resume S`` and the sweep's own ``-m`` command run again with ``hydra.sweep.dir=S`` do the same:
the launcher reads what S's ``launch/manifest.json`` recorded when the sweep was first submitted (its
*definition*: every point's overrides by job number, the sweep's config without ``hydra``, and the command line
that launched it), and before any job is set up or anything is submitted:

* a definition that differs (another point, another number of points, another config value) is one line naming
  the first difference (:func:`difference`), exit status 2: a resumed sweep is the sweep that was recorded;
* every recorded member's state comes from its backend, one query per backend for all of them
  (:func:`automodel_hydra.progress.backend_states`: ``sacct`` once for a whole Slurm array), read through what its
  ranks wrote (``result.json`` of that launch, the ranks' end records: :mod:`automodel_hydra.outcome`);
* :func:`decide` sorts the members: COMPLETED ones are kept (nothing in their dirs is read beyond the small
  launch records and ``result.json``, nothing is written); FAILED, CANCELLED, TIMEOUT, ... and never started
  ones run again, each as the job number and in the dir it had, so the bundled recipe resumes from its own
  ``checkpoints/latest``; a member still RUNNING or PENDING is neither: the resume is refused, naming it
  (:func:`busy_line`), because its end is not known yet and, for a local sweep, the command that started it may
  still be starting the others;
* one line says what is kept and what runs again (:func:`summary`), e.g.
  ``resume: 3 of 4 members COMPLETED and kept; running again: 1 (#2 FAILED)``.

Everything here but :func:`member_states` and what reads the manifest (:mod:`automodel_hydra.records`) is pure.
"""

from __future__ import annotations

import dataclasses
import json
import typing as tp
from pathlib import Path

from automodel_hydra.records import manifest_path, read_manifest
from automodel_hydra.states import JobState

#: The manifest's key for the sweep's definition (beside ``jobs``, the members' submission records).
DEFINITION_KEY = "sweep"
#: How many members the summary line names one by one before it counts the rest.
NAMED = 12


@dataclasses.dataclass(frozen=True)
class Definition:
    """What makes a sweep the sweep it is.

    ``points``: each job number's overrides, as the sweeper gave them (``#N : overrides``); ``config``: the
    sweep's config without its ``hydra`` node, unresolved (interpolations as written), flattened to dotted keys
    (lists whole); ``argv``/``cwd``: the command line after the interpreter (``sys.orig_argv[1:]``) and its working
    dir, which ``automodel-hydra resume`` runs again."""

    points: tp.Mapping[int, tuple[str, ...]]
    config: tp.Mapping[str, tp.Any]
    argv: tuple[str, ...] = ()
    cwd: str = ""

    def to_json(self) -> dict[str, tp.Any]:
        return {"points": {str(n): list(o) for n, o in sorted(self.points.items())}, "config": dict(self.config),
                "argv": list(self.argv), "cwd": self.cwd}

    @classmethod
    def from_json(cls, data: tp.Mapping[str, tp.Any]) -> Definition:
        return cls({int(n): tuple(o) for n, o in data.get("points", {}).items()}, dict(data.get("config", {})),
                   tuple(data.get("argv", ())), str(data.get("cwd", "")))


#: Top-level keys that say how a launch is made, not what a member computes: left out of a definition, so a
#: resume may be a dry run (``dry_run=true``) of the sweep it resumes.
NOT_DEFINING = ("dry_run",)


def _key(override: str) -> str:
    """An override's key: ``++a.b=1`` -> ``a.b``."""
    return override.lstrip("+~").split("=", 1)[0]


def point(overrides: tp.Iterable[str]) -> tuple[str, ...]:
    """A job's overrides as its point of the definition: every override but those of :data:`NOT_DEFINING`."""
    return tuple(str(o) for o in overrides
                 if _key(str(o)).split(".", 1)[0] not in NOT_DEFINING)


def same_point(old: tp.Sequence[str], new: tp.Sequence[str]) -> bool:
    """Whether two jobs' overrides make the same job: the same overrides, in any order while each key appears
    once (Hydra applies the config-group choices before the values, and one value per key gives one config
    whatever the order); in the order given when a key appears twice (``a=1 a=2``, ``+a=1 ~a``: the later one
    wins)."""
    if tuple(old) == tuple(new):
        return True
    keys = [_key(o) for o in new]
    return len(set(keys)) == len(keys) and sorted(old) == sorted(new)


def flatten(node: tp.Any, prefix: str = "") -> dict[str, tp.Any]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"a.b": 1, "c": [1, 2]}``, with every value as JSON gives it back
    (so a recorded definition and one made now compare equal when they are). An empty mapping stays a value."""
    if isinstance(node, dict) and node:
        out: dict[str, tp.Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: json.loads(json.dumps(node, default=str))}


def merged(recorded: tp.Mapping[str, tp.Any] | None, now: Definition) -> dict[str, tp.Any]:
    """The manifest's definition after a launch of ``now``'s points: the points of every launch of the sweep (a
    sweeper may launch it in batches) and the first launch's config and command line."""
    out = now.to_json()
    if recorded:
        out = {**out, **{k: v for k, v in recorded.items() if k != "points"},
               "points": {**recorded.get("points", {}), **out["points"]}}
    return out


def manifest_fields(now: Definition) -> tp.Callable[[tp.Mapping[str, tp.Any]], dict[str, tp.Any]]:
    """What a launch of ``now``'s points records in the sweep's manifest, given the one there: the definition
    :func:`merged` with the recorded one (:func:`automodel_hydra.records.write_manifest`)."""
    def fields(manifest: tp.Mapping[str, tp.Any]) -> dict[str, tp.Any]:
        recorded = manifest.get(DEFINITION_KEY)
        return {DEFINITION_KEY: merged(recorded if isinstance(recorded, dict) else None, now)}
    return fields


def _shown(overrides: tp.Sequence[str]) -> str:
    return " ".join(overrides) or "(no overrides)"


def difference(now: Definition, then: Definition, whole: bool, by: str = "this command") -> str | None:
    """The first way ``now`` is not the recorded sweep ``then``, as the tail of one line, else None.

    ``whole``: ``now`` holds every point of the sweep (no ``hydra.sweeper.max_batch_size``), so a point only one
    of them has is a difference too; otherwise only the job numbers both have are compared. ``by``: what made
    ``now``, as the line names it (``this command``; a resume: ``the recorded command now``)."""
    for num in sorted(now.points):
        if num not in then.points:
            if not whole:  # a later batch of a sweeper that launches in batches
                continue
            return (f"it was swept over {len(then.points)} point(s), {by} adds job {num} "
                    f"({_shown(now.points[num])})")
        old, new = tuple(then.points[num]), tuple(now.points[num])
        if not same_point(old, new):
            had, has = [o for o in old if o not in new], [o for o in new if o not in old]
            if not had and not has:  # the same overrides in another order
                had, has = list(old), list(new)
            if not had or not has:
                return f"{by} {'adds' if has else 'drops'} {_shown(has or had)} (job {num}: {_shown(new)})"
            return f"job {num} had {_shown(had)}, {by} gives it {_shown(has)}"
    if whole:
        gone = sorted(set(then.points) - set(now.points))
        if gone:
            return (f"it was swept over {len(then.points)} point(s), {by} over {len(now.points)} "
                    f"(job {gone[0]}: {_shown(then.points[gone[0]])} is not in it)")
    for key in sorted(set(now.config) | set(then.config)):
        old_v, new_v = then.config.get(key, _MISSING), now.config.get(key, _MISSING)
        if old_v != new_v:
            return f"its config had {key}={_value(old_v)}, {by} gives {key}={_value(new_v)}"
    return None


_MISSING = object()


def _value(v: tp.Any) -> str:
    return "(not set)" if v is _MISSING else json.dumps(v)


def difference_line(sweep_dir: Path | str, tail: str) -> str:
    """The one line for a changed definition (:func:`difference`), with the way out: for the ``-m`` command run
    again with ``hydra.sweep.dir`` of another sweep."""
    return (f"{sweep_dir} holds another sweep ({manifest_path(sweep_dir)}): {tail}; a sweep dir is "
            f"resumed only with the sweep it recorded (automodel-hydra resume {sweep_dir}): choose another "
            "hydra.sweep.dir for this one")


#: What ``automodel-hydra resume S`` runs the recorded command with (the sweep dir), so that the launcher's line
#: for a changed definition fits the command the user ran (:func:`resume_line`); taken out of the environment
#: before any job is set up (:func:`resumed_by_cli`), so no job inherits it.
RESUMING_ENV = "AUTOMODEL_HYDRA_RESUMING"
#: How :func:`difference` names what composed the definition on a resume.
RESUMED_BY = "the recorded command now"


def resumed_by_cli(environ: tp.MutableMapping[str, str]) -> bool:
    """Whether ``automodel-hydra resume`` started this command (:data:`RESUMING_ENV`); removes the mark."""
    return environ.pop(RESUMING_ENV, None) is not None


def resume_line(sweep_dir: Path | str, tail: str, changed: tp.Sequence[str] = ()) -> str:
    """The one line refusing ``automodel-hydra resume sweep_dir`` whose recorded command now composes another
    sweep (:func:`difference` ``by=`` :data:`RESUMED_BY`): the command line is the recorded one, so what changed is
    a config it reads (``changed``: the config files modified since the sweep was submitted, as far as known)."""
    what = (f"{_named(list(changed))} changed since the sweep was submitted" if changed else
            "a config file it reads changed since the sweep was submitted")
    return (f"cannot resume {sweep_dir}: {what}, so its recorded command now makes another sweep than the one in "
            f"{manifest_path(sweep_dir)}: {tail}; nothing was submitted: put the config back as it was to resume "
            "this sweep, or run the changed sweep in a dir of its own (its -m command with another hydra.sweep.dir)")


#: A member that was never submitted (a later batch of a stopped sweeper) or never started.
NEVER_STARTED = "never started"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a resume does with each member of the points it was given: ``kept`` (COMPLETED), ``again``
    (job number, why: a final state's name or ``never started``), ``busy`` (job number, RUNNING or PENDING)."""

    kept: tuple[int, ...]
    again: tuple[tuple[int, str], ...]
    busy: tuple[tuple[int, JobState], ...]

    @property
    def total(self) -> int:
        return len(self.kept) + len(self.again) + len(self.busy)


def decide(points: tp.Iterable[int], states: tp.Mapping[int, JobState | None]) -> Decision:
    """Sort job numbers by their state (``states[num]``; None or absent: never started). Pure.

    COMPLETED is kept; RUNNING and PENDING are busy; every other state, UNKNOWN included (the scheduler forgot
    the job and its ranks left no result of that launch), runs again."""
    kept, again, busy = [], [], []
    for num in sorted(points):
        state = states.get(num)
        if state is JobState.COMPLETED:
            kept.append(num)
        elif state in (JobState.RUNNING, JobState.PENDING):
            busy.append((num, state))
        else:
            again.append((num, NEVER_STARTED if state is None else state.value))
    return Decision(tuple(kept), tuple(again), tuple(busy))


def _named(items: tp.Sequence[str]) -> str:
    shown = ", ".join(items[:NAMED])
    return shown + (f", ... ({len(items) - NAMED} more)" if len(items) > NAMED else "")


def summary(decision: Decision) -> str:
    """``resume: 3 of 4 members COMPLETED and kept; running again: 1 (#2 FAILED)``."""
    again = [f"#{n} {why}" for n, why in decision.again]
    tail = f"running again: {len(again)} ({_named(again)})" if again else "nothing to run again"
    return f"resume: {len(decision.kept)} of {decision.total} members COMPLETED and kept; {tail}"


def busy_line(sweep_dir: Path | str, decision: Decision) -> str:
    """The one line refusing a resume while members are RUNNING or PENDING."""
    busy = [f"#{n} {state.value}" for n, state in decision.busy]
    first = decision.busy[0][0]
    return (f"{sweep_dir} is not done: {_named(busy)}; nothing was submitted: wait for them to end (automodel-hydra "
            f"status {sweep_dir}) or cancel them (automodel-hydra cancel {sweep_dir} {first}), then resume")


# ----------------------------------------------------------------------------------------------- reading


def recorded_definition(manifest: tp.Mapping[str, tp.Any] | None) -> Definition | None:
    """The definition a manifest recorded, None for none (a manifest written before definitions were)."""
    data = (manifest or {}).get(DEFINITION_KEY)
    return Definition.from_json(data) if isinstance(data, dict) else None


#: Where to find a sweep dir, for a resume given something else.
WHICH_DIR = ("resume takes the dir of a sweep (-m), the first line it printed (automodel-hydra runs lists those "
             "made here)")


def refusal(sweep_dir: Path) -> str | None:
    """Why ``automodel-hydra resume sweep_dir`` cannot run (one line), or None: ``sweep_dir`` does not exist, is
    not a sweep dir (no ``launch/manifest.json``; a member's dir names its sweep), or is a sweep submitted before
    definitions were recorded (its command line is not known)."""
    if not sweep_dir.is_dir():
        return f"{sweep_dir} does not exist: {WHICH_DIR}"
    manifest = read_manifest(sweep_dir)
    if manifest is None:
        above = next((d for d in sweep_dir.parents if read_manifest(d) is not None), None)
        where = (f"it is a member of the sweep {above}: automodel-hydra resume {above}" if above is not None
                 else WHICH_DIR)
        return f"{sweep_dir} is not a sweep dir (no {manifest_path(sweep_dir)}): {where}"
    definition = recorded_definition(manifest)
    if definition is None or not definition.argv:
        return (f"{sweep_dir} holds a sweep submitted before sweeps recorded their definition (no "
                f"{DEFINITION_KEY!r} in {manifest_path(sweep_dir)}), so its command is not known: run "
                f"its -m command again with hydra.sweep.dir={sweep_dir} (every member runs again)")
    return None


def member_states(records: tp.Sequence[tp.Mapping[str, tp.Any]]) -> dict[int, JobState]:
    """Each recorded member's state by job number: one ``states`` query per backend for all of them, the same
    states as ``automodel-hydra status`` (a local member queued by a command that ended before starting it is
    CANCELLED: :func:`automodel_hydra.backends.interactive.local_state`)."""
    from automodel_hydra.progress import backend_states

    return {int(record.get("job_num") or 0): info.state
            for record, info in zip(records, backend_states([dict(r) for r in records]))}


def command(definition: Definition, sweep_dir: Path | str) -> list[str]:
    """The recorded command line (after the interpreter) with its sweep dir pinned to ``sweep_dir``: every
    ``hydra.sweep.dir=`` it had replaced, else one appended (a default dir made from the clock would be new)."""
    pin = f"hydra.sweep.dir={Path(sweep_dir).resolve()}"
    argv = [pin if a.lstrip("+").startswith("hydra.sweep.dir=") else a for a in definition.argv]
    return argv if pin in argv else [*argv, pin]
