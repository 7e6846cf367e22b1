"""Our own sbatch script renderer and the parsers around it: pure functions, no I/O, no submitit.

* :func:`render_sbatch` writes the batch script: ``#SBATCH`` directives in the caller's order, setup lines, and
  one ``srun`` line.
* :func:`parse_job_id` reads the job id that ``sbatch --parsable`` prints; :func:`sbatch_hint` says what a refusal
  means (no configuration, no controller, no GPUs).
* :data:`SRUN_EXPORT_ARGS` and :func:`sbatch_export_args` keep a job working where the site exports nothing
  (``SBATCH_EXPORT=NONE``); see "Site export settings" in docs/slurm.md.
* :func:`pattern_literal` writes a directory name into an sbatch filename pattern (``%`` -> ``%%``).

Quoting rules, from Slurm's own parser of ``#SBATCH`` lines (``_get_argument`` in ``src/sbatch/opt.c``): a
value is one argument up to unquoted whitespace; single or double quotes group characters; a backslash escapes
the next character *even inside quotes*; an unquoted ``#`` starts a comment; a line ends the argument. So a value
that needs quoting is written ``"..."`` with ``\\`` and ``"`` backslash-escaped, and a newline cannot be written
at all. bash never reads ``#SBATCH`` lines; the ``srun`` line is bash and is quoted with :func:`shlex.quote`.
"""

from __future__ import annotations

import re
import shlex
import typing as tp

from automodel_hydra.plan import SubmitError
from automodel_hydra.schema import UserValueError

#: What srun needs so that every task gets the environment the batch script built (PYTHONPATH, MASTER_ADDR, ...).
#: Under ``sbatch --export=NONE`` (or ``SBATCH_EXPORT=NONE``) sbatch sets ``SLURM_EXPORT_ENV=NONE`` in the batch
#: environment and srun reads it as its own ``--export``, so the tasks would start with no variables at all, not
#: even PATH; a command-line ``--export=ALL`` beats ``SLURM_EXPORT_ENV`` and ``SRUN_EXPORT_ENV`` (srun(1),
#: ``--export`` and "INPUT ENVIRONMENT VARIABLES").
SRUN_EXPORT_ARGS: tuple[str, ...] = ("--export=ALL",)

#: sbatch options whose value is a "filename pattern" (sbatch(1)): ``%j`` and friends are expanded, and a backslash
#: anywhere in the name turns every pattern off and is dropped, so the file would land in another directory.
PATTERN_OPTIONS = frozenset({"output", "error", "input"})



class ShellWord(str):
    """An srun argument already quoted for bash by its caller, written into the ``srun`` line as it is (so that it
    may refer to the batch step's variables, e.g. ``--container-mounts="$HF_HOME:$HF_HOME",...``)."""


_OPTION = re.compile(r"[a-z][a-z0-9-]*\Z")
_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+\Z")  # written as is: nothing sbatch's parser treats specially
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_JOB_ID = re.compile(r"(\d+)(?:;[^\s;]+)?\Z")


def render_sbatch(*, directives: tp.Sequence[tuple[str, object]], setup: tp.Sequence[str],
                  srun_args: tp.Sequence[str], command: str, after: tp.Sequence[str] = ()) -> str:
    """The text of an sbatch batch script.

    Parameters
    ----------
    directives
        sbatch long options without the dashes, in the order they are written: ``("job-name", "x")``,
        ``("time", 240)`` (minutes), ``("requeue", True)`` (``True`` = a bare flag ``#SBATCH --requeue``),
        ``("array", "0-9%4")``, ``("output", "/runs/a/slurm/%j.out")`` (a filename pattern: ``%j`` stays a pattern;
        write a literal directory with :func:`pattern_literal`).
    setup
        bash lines run by the batch step before srun (``export ...``, ``module load ...``).
    srun_args
        srun's own arguments, each quoted for bash (a :class:`ShellWord` is written as it is).
    command
        what every task runs: a bash command line, written as given (the caller quotes it).
    after
        bash lines run by the batch step after srun (``$?`` is srun's exit status on the first).

    Returns
    -------
    str
        ``#!/bin/bash``, the ``#SBATCH`` lines (sbatch reads them only before the first command), a ``# setup``
        block, and ``# command``: ``srun ARGS COMMAND``; ends with a newline.

    Raises
    ------
    UserValueError
        naming the option: a name that is not a long option, a repeated option, a value that is ``None``,
        ``False`` or empty (leave the option out instead), a newline, carriage return or NUL in a value (sbatch
        reads one option per line), or a backslash in a filename pattern (``output``/``error``/``input``, also in
        ``srun_args``): sbatch(1) drops it and turns ``%`` patterns off, so the file would be written elsewhere.
    """
    lines = ["#!/bin/bash"]
    seen: set[str] = set()
    for name, value in directives:
        if not isinstance(name, str) or not _OPTION.match(name):
            raise UserValueError(f"sbatch option {name!r}: not a long option name (lower case, digits and '-', e.g. "
                             "'job-name'; no leading dashes)")
        if name in seen:
            raise UserValueError(f"sbatch option --{name} is given twice; sbatch would keep only the last one")
        seen.add(name)
        lines.append(f"#SBATCH --{name}" if value is True else f"#SBATCH --{name}={directive_value(name, value)}")
    _check_srun_patterns(srun_args)
    srun = " ".join(["srun", *(a if isinstance(a, ShellWord) else shlex.quote(str(a)) for a in srun_args), command])
    return "\n".join([*lines, "", "# setup", *setup, "", "# command", srun, *after, ""])


def directive_value(name: str, value: object) -> str:
    """``value`` written for sbatch's ``#SBATCH`` parser: as is when plain, else ``"..."`` with ``\\`` and ``"``
    escaped. Raises UserValueError (naming ``--name``) for the values :func:`render_sbatch` refuses.
    """
    if value is None or value is False:
        raise UserValueError(f"sbatch option --{name}: {value!r} is not a value; leave the option out, or pass True "
                             "for "
                         "a bare flag")
    text = str(value)
    if text == "":
        raise UserValueError(f"sbatch option --{name}: empty value; leave the option out instead")
    for bad, what in (("\n", "a newline"), ("\r", "a carriage return"), ("\0", "a NUL character")):
        if bad in text:
            raise UserValueError(f"sbatch option --{name}={text!r}: contains {what}; sbatch reads one option per line, "
                             "so the value cannot be written into the script")
    if name in PATTERN_OPTIONS and "\\" in text:
        raise UserValueError(_backslash_message(name, text))
    if _PLAIN.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _backslash_message(name: str, text: str) -> str:
    return (f"--{name}={text!r}: a filename pattern cannot contain a backslash (sbatch(1), \"filename pattern\": "
            f"Slurm drops it and expands no %-pattern, so the file would be {text.replace(chr(92), '')!r}); "
            "use a directory without a backslash")


def _check_srun_patterns(srun_args: tp.Sequence[str]) -> None:
    """srun's ``--output``/``--error``/``--input`` are filename patterns too (srun(1))."""
    args = [str(a) for a in srun_args]
    for i, arg in enumerate(args):
        for name in PATTERN_OPTIONS:
            if arg.startswith(f"--{name}="):
                value = arg.split("=", 1)[1]
            elif arg == f"--{name}" and i + 1 < len(args):
                value = args[i + 1]
            else:
                continue
            if "\\" in value:
                raise UserValueError("srun " + _backslash_message(name, value))


def task_ids(job_nums: tp.Sequence[int | None], max_array_size: int) -> list[int]:
    """The array task ids of a sweep's jobs: their own job numbers when every one is below MaxArraySize (array
    indices run 0..MaxArraySize-1, slurm.conf(5)), so task N is job N, and a resumed sweep's array holds just
    the members that run again (``--array=2,5,7``); else 0..n-1 (an array past MaxArraySize, split)."""
    nums = [n for n in job_nums if n is not None]
    if len(nums) == len(job_nums) and nums == sorted(set(nums)) and max(nums, default=0) < max_array_size:
        return nums  # (ascending, as array_spec writes them: task ids[i] is job_nums[i])
    return list(range(len(job_nums)))


def array_spec(ids: tp.Sequence[int]) -> str:
    """sbatch's ``--array`` index list for ``ids`` (sbatch(1), ``--array``: ranges and single indices, comma
    separated): ``[0, 1, 2, 5, 7, 8]`` -> ``0-2,5,7-8``."""
    parts: list[str] = []
    start = prev = None
    for i in [*sorted(ids), None]:
        if start is not None and (i is None or i != prev + 1):  # type: ignore[operator]
            parts.append(f"{start}-{prev}" if prev != start else str(start))
            start = None
        if i is not None and start is None:
            start = i
        prev = i
    return ",".join(parts)


def array_ids(spec: str) -> list[int]:
    """The task ids an ``--array`` index list names, in order (:func:`array_spec`, its ``%N`` limit dropped)."""
    out: list[int] = []
    for part in spec.split("%")[0].split(","):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def script_task_ids(text: str) -> list[int]:
    """The task ids of an array script's ``#SBATCH --array=`` line, in order (:func:`array_ids`)."""
    for line in text.splitlines():
        if line.startswith("#SBATCH --array="):
            return array_ids(line.split("=", 1)[1].strip().strip('"'))
    raise ValueError("no #SBATCH --array= line in the array script")


def pattern_literal(path: object) -> str:
    """``path`` as a literal part of an sbatch/srun filename pattern: every ``%`` doubled (sbatch(1), "filename
    pattern": ``%%`` is the character ``%``). ``pattern_literal(run_dir) + "/slurm/%j.out"``."""
    return str(path).replace("%", "%%")


def parse_job_id(stdout: str) -> str:
    """The job id in what ``sbatch --parsable`` printed: ``"123\\n"`` -> ``"123"``, ``"123;cluster"`` -> ``"123"``
    (sbatch(1), ``--parsable``: "jobid[;cluster_name]").

    Raises
    ------
    SubmitError
        one line quoting the raw output, when it is anything else (empty, or ``Submitted batch job 123`` from an
        sbatch run without ``--parsable``).
    """
    m = _JOB_ID.match(stdout.strip())
    if m is None:
        raise SubmitError(f"sbatch --parsable printed {stdout!r}; expected a job id such as '123' or '123;cluster'")
    return m.group(1)


#: sbatch's words for a request the cluster cannot meet or for "no cluster to talk to", and what the user is
#: missing (slurm.conf(5): SLURM_CONF names the configuration; a configless cluster answers only on its login nodes).
SBATCH_HINTS = (
    ("Unable to process configuration file", ": the Slurm configuration cannot be read; set SLURM_CONF to the "
     "cluster's slurm.conf, or submit from a login node"),
    ("Could not establish a configuration source", ": this machine has the Slurm client but no configuration; "
     "set SLURM_CONF to the cluster's slurm.conf, or submit from a login node"),
    ("Invalid generic resource (gres) specification", ": slurm.gpus_per_node (#SBATCH --gpus-per-node) asks for "
     "GPUs that this cluster or partition does not have: leave slurm.gpus_per_node out (no GPU request) or set "
     "it to what the nodes have (sinfo -o '%P %G')"),
    ("Unable to contact slurm controller", ": the Slurm controller does not answer from here; submit from a login "
     "node, or check SLURM_CONF (scontrol ping)"),
    ("resolve", ": the Slurm controller's host name does not resolve here; submit from a login node, or check "
     "SLURM_CONF (scontrol ping)"),
)


def sbatch_hint(said: tp.Sequence[str]) -> str:
    """What the user is missing, for the lines sbatch wrote when it refused a job (:data:`SBATCH_HINTS`), as
    ``": ..."`` to end the error line with; "" when no hint fits."""
    return next((h for pattern, h in SBATCH_HINTS if any(pattern in line for line in said)), "")


def sbatch_export_args(environ: tp.Mapping[str, str], names: tp.Sequence[str]) -> list[str]:
    """The ``--export`` argument the sbatch command line needs so that the job sees the submitting shell's
    variables ``names`` (the ``"${VAR}"`` references of ``slurm.env_vars``), whatever the site's ``SBATCH_EXPORT``.

    sbatch exports the whole submitting environment by default (``--export=ALL``); ``SBATCH_EXPORT`` (an input
    variable, "same as --export") changes that, and a command-line option beats it (sbatch(1), ``--export`` and
    "INPUT ENVIRONMENT VARIABLES"). Returns:

    * ``[]`` when ``SBATCH_EXPORT`` is unset, empty or contains ``ALL`` (every variable reaches the job), or when
      ``names`` is empty (the script itself exports all it needs; srun passes it on with :data:`SRUN_EXPORT_ARGS`);
    * else ``["--export=SITE,NAMES"]``: the site's own list (``NONE`` dropped) with ``names`` added, so the site's
      choice stands for every other variable. Only names go on the command line, never values.

    Raises UserValueError naming a name that is not a shell variable name.
    """
    for name in names:
        if not _NAME.match(name):
            raise UserValueError(f"--export: {name!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    site = [t.strip() for t in environ.get("SBATCH_EXPORT", "").split(",") if t.strip()]
    if not names or not site or any(t.upper() == "ALL" for t in site):
        return []
    kept = [t for t in site if t.upper() != "NONE"]
    listed = {t.split("=", 1)[0] for t in kept}
    return ["--export=" + ",".join([*kept, *(n for n in dict.fromkeys(names) if n not in listed)])]


#: sbatch's input environment variables and the options each one sets (sbatch(1) of Slurm 22.05, "INPUT ENVIRONMENT
#: VARIABLES": "Environment variables will override any options set in a batch script, and command line options
#: will override any environment variables"), with the options it clashes with (``--mem`` and ``--mem-per-cpu``
#: exclude each other, as ``--requeue`` and ``--no-requeue`` do). Left out: ``SBATCH_EXPORT`` (a site's choice,
#: kept and read by :func:`sbatch_export_args`), the ones of no option a script sets (``SBATCH_DEBUG``,
#: ``SBATCH_GET_USER_ENV``, ``SBATCH_IGNORE_PBS``, ``SBATCH_BATCH``), and ``SLURM_CLUSTERS``/``SLURM_HINT``, which
#: never reach sbatch (:func:`automodel_hydra.backends.slurm_transport.submit_env` drops every ``SLURM_*``, as it
#: drops ``SRUN_*``; srun's options in the script are on its command line, which beats its input variables, and
#: ``SALLOC_*`` are read by salloc alone, which no plan runs).
SBATCH_INPUT_VARS: dict[str, tuple[str, ...]] = {
    "SBATCH_ACCOUNT": ("account",), "SBATCH_ACCTG_FREQ": ("acctg-freq",), "SBATCH_ARRAY_INX": ("array",),
    "SBATCH_CLUSTERS": ("clusters",), "SBATCH_CONSTRAINT": ("constraint",), "SBATCH_CONTAINER": ("container",),
    "SBATCH_CORE_SPEC": ("core-spec",), "SBATCH_CPUS_PER_GPU": ("cpus-per-gpu", "cpus-per-task"),
    "SBATCH_DELAY_BOOT": ("delay-boot",), "SBATCH_DISTRIBUTION": ("distribution",), "SBATCH_ERROR": ("error",),
    "SBATCH_EXCLUSIVE": ("exclusive",), "SBATCH_GPU_BIND": ("gpu-bind",), "SBATCH_GPU_FREQ": ("gpu-freq",),
    "SBATCH_GPUS": ("gpus", "gpus-per-node"), "SBATCH_GPUS_PER_NODE": ("gpus-per-node",),
    "SBATCH_GPUS_PER_TASK": ("gpus-per-task", "gpus-per-node"), "SBATCH_GRES": ("gres",),
    "SBATCH_GRES_FLAGS": ("gres-flags",), "SBATCH_HINT": ("hint",), "SBATCH_INPUT": ("input",),
    "SBATCH_JOB_NAME": ("job-name",), "SBATCH_MEM_BIND": ("mem-bind",),
    "SBATCH_MEM_PER_CPU": ("mem-per-cpu", "mem", "mem-per-gpu"),
    "SBATCH_MEM_PER_GPU": ("mem-per-gpu", "mem", "mem-per-cpu"),
    "SBATCH_MEM_PER_NODE": ("mem", "mem-per-cpu", "mem-per-gpu"), "SBATCH_NETWORK": ("network",),
    "SBATCH_NO_KILL": ("no-kill",), "SBATCH_NO_REQUEUE": ("no-requeue", "requeue"),
    "SBATCH_OPEN_MODE": ("open-mode",), "SBATCH_OUTPUT": ("output",), "SBATCH_OVERCOMMIT": ("overcommit",),
    "SBATCH_PARTITION": ("partition",), "SBATCH_POWER": ("power",), "SBATCH_PROFILE": ("profile",),
    "SBATCH_QOS": ("qos",), "SBATCH_REQ_SWITCH": ("switches",), "SBATCH_REQUEUE": ("requeue", "no-requeue"),
    "SBATCH_RESERVATION": ("reservation",), "SBATCH_SIGNAL": ("signal",), "SBATCH_SPREAD_JOB": ("spread-job",),
    "SBATCH_THREAD_SPEC": ("thread-spec",), "SBATCH_THREADS_PER_CORE": ("threads-per-core",),
    "SBATCH_TIMELIMIT": ("time",), "SBATCH_USE_MIN_NODES": ("use-min-nodes",), "SBATCH_WAIT": ("wait",),
    "SBATCH_WAIT_ALL_NODES": ("wait-all-nodes",), "SBATCH_WAIT4SWITCH": ("switches",), "SBATCH_WCKEY": ("wckey",),
}
#: Options a plan decides even where its script writes none: a single job is no array, sbatch returns once the job
#: is queued (the launcher follows it itself), and the batch step's stderr goes where ``--output`` says.
DECIDED = ("array", "wait", "error")
_DIRECTIVE = re.compile(r"#SBATCH\s+--([a-z][a-z0-9-]*)")


def overridden(script: str, names: tp.Iterable[str]) -> list[tuple[str, str]]:
    """``(variable, option)`` for each of ``names`` (the variables set where sbatch runs) that would override an
    option the batch ``script`` sets in an ``#SBATCH`` line, or one of :data:`DECIDED` (:data:`SBATCH_INPUT_VARS`);
    in the table's order. Such a variable is kept out of sbatch's environment, so the job gets what the plan (and
    a dry run) shows; a variable of an option the script does not set (a site's ``SBATCH_ACCOUNT``) is not."""
    planned = {m.group(1) for line in script.splitlines() if (m := _DIRECTIVE.match(line))} | set(DECIDED)
    present = set(names)
    return [(var, next(o for o in options if o in planned)) for var, options in SBATCH_INPUT_VARS.items()
            if var in present and any(o in planned for o in options)]


def dropped_line(dropped: tp.Sequence[tuple[str, str]], login: str | None) -> str:
    """The one line naming the :func:`overridden` variables left out of sbatch's environment in this shell
    (``login`` None), or in the login shell of ``login`` (``me@login``)."""
    side = "this shell" if login is None else f"the login shell of {login}"
    return (f"{', '.join(v for v, _ in dropped)}, set in {side}, would override the planned "
            f"{', '.join(dict.fromkeys(f'--{o}' for _, o in dropped))} (sbatch(1): input variables beat #SBATCH "
            "lines): left out of sbatch's environment, so the job gets what the plan shows")


__all__ = [
    "DECIDED",
    "SBATCH_INPUT_VARS",
    "dropped_line",
    "overridden",
    "PATTERN_OPTIONS",
    "SBATCH_HINTS",
    "SRUN_EXPORT_ARGS",
    "directive_value",
    "parse_job_id",
    "pattern_literal",
    "render_sbatch",
    "sbatch_export_args",
    "sbatch_hint",
    "array_ids",
    "array_spec",
    "script_task_ids",
    "task_ids",
]
