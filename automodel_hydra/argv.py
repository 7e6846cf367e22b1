"""The command line, read once: Hydra's own flags (:data:`HYDRA_FLAGS`, the one table; :func:`parse`, the one
parser), and command lines that name a config file of the user's own (an AutoModel YAML, unchanged), adapted for
Hydra.

The two shapes that name a user's file run it with our launcher and output dirs, without a line added to it:

* ``python train.py --config-dir D --config-name F [overrides]`` (Hydra's own shape);
* ``automodel-hydra F.yaml [--a.b=c | a.b=c ...] [-m]`` (AutoModel's CLI shape: ``automodel cfg.yaml --a.b=c``),
  and AutoModel's older ``automodel-hydra finetune llm -c F.yaml``: :func:`from_automodel_cli` has the forms.

What :func:`for_user_config` adds, each only when the command line does not set it already: our Hydra launcher
(``hydra/launcher=automodel``, so ``-m`` becomes one Slurm job array) and sweeper (``automodel_basic``), and our
run and sweep dirs (one dir per
command); ``dry_run=X`` becomes ``++dry_run=X`` (a user's file has no ``dry_run`` key), and AutoModel's
``--a.b=c`` becomes Hydra's ``++a.b=c`` (set, adding the key when the file lacks it, as AutoModel's CLI does).
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing as tp
from pathlib import Path

from automodel_hydra.schema import UserError

#: Our output dirs' one home: the bundled config's ``hydra`` group, which a user's file runs with too.
HYDRA_DIRS = Path(__file__).resolve().parent / "conf" / "hydra" / "automodel.yaml"


def default_dirs() -> tuple[str, str]:
    """Our default ``(hydra.run.dir, hydra.sweep.dir)``, as :data:`HYDRA_DIRS` writes them (unresolved)."""
    import yaml

    dirs = yaml.safe_load(HYDRA_DIRS.read_text())
    return str(dirs["run"]["dir"]), str(dirs["sweep"]["dir"])


def _names_user_config(argv: list[str]) -> bool:
    return parse(argv).given("--config-name") is not None


#: Our config groups (``conf/``), which a user's file has no defaults-list entry for unless it names them.
GROUPS = ("launcher", "profile", "sweep")


def for_user_config(argv: list[str]) -> list[str]:
    """``argv`` (without the program) adapted as the module docstring says; unchanged when no user config is named.

    The override forms ``train.py`` takes mean the same for a user's file: a group choice (``launcher=skypilot``,
    ``profile=nsys``, ``sweep=NAME``) the file's defaults list does not name is added (``+launcher=skypilot``), and
    a key of a section our schema types (:func:`_typed_sections`: the launchers', ``profile``, ``seed``, and for a
    file of the bundled recipe every section) is set, adding it when the file lacks it (``slurm.nodes=2`` ->
    ``++slurm.nodes=2``; a launcher's only where the file has its section or the line chooses it, since the section
    routes the job); an unknown key there is still refused by the schema, naming it. For a file of an AutoModel
    recipe, the resume key ``restore_from.path`` (:mod:`automodel_hydra.automodel.resume`, which its files seldom
    have) is set the same way. A recipe's own keys keep Hydra's rule (the key must be in the file; AutoModel's
    ``--a.b=c`` adds it)."""
    if not _names_user_config(argv):
        return argv
    file = _named_file(argv)
    sections = _top_level(file) if file is not None else {}
    in_defaults = _default_groups(sections.get("defaults"))
    typed = _typed_sections(sections)
    # a launcher's section routes the job there: its keys are set only where the file has it or the command line
    # chooses that launcher (else driver.refuse_unselected_sections says to add launcher=...)
    from automodel_hydra.sections import LAUNCHER_SECTIONS

    chosen = {a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("launcher=")}
    typed -= {s for s in LAUNCHER_SECTIONS if sections.get(s) is None and s not in chosen}
    out: list[str] = []
    for item in parse(argv).items:
        if isinstance(item, Given):  # Hydra's own flag, as given
            out += item.words
            continue
        a, key = item, item.split("=", 1)[0]
        if a.startswith("--") and "=" in a:
            a = "++" + a[2:]  # AutoModel's --a.b=c
        elif _OVERRIDE.match(a) and not a.startswith(("+", "~")):
            if key in GROUPS and key not in in_defaults:
                a = "+" + a
            elif "/" not in key and key.split(".")[0] in typed or _settable(sections, key):
                a = "++" + a
        out.append(a)
    keys = {a.split("=", 1)[0].lstrip("+~") for a in out if "=" in a}
    if "hydra/launcher" not in keys:
        out.append("hydra/launcher=automodel")
    if "hydra/sweeper" not in keys:
        out.append("hydra/sweeper=automodel_basic")
    run_dir, sweep_dir = default_dirs()
    if "hydra.run.dir" not in keys:
        out.append(f"hydra.run.dir={run_dir}")
    if "hydra.sweep.dir" not in keys:
        out.append(f"hydra.sweep.dir={sweep_dir}")
    return out


def _settable(sections: dict[str, tp.Any], key: str) -> bool:
    """Whether a command line may add ``key`` to a user's file beyond the typed sections: one of its recipe kind's
    :attr:`~automodel_hydra.recipe_kind.RecipeKind.settable_keys` (the kind is asked only for a key some kind
    has); False for a ``recipe:`` value that is no recipe name (planning names that)."""
    from automodel_hydra import recipe_kind
    from automodel_hydra.recipe_names import RecipeError

    if key not in recipe_kind.SETTABLE_KEYS:
        return False
    try:
        return key in recipe_kind.for_file(sections).settable_keys
    except RecipeError:
        return False


def _named_file(argv: list[str]) -> Path | None:
    """The user's config file that ``--config-dir D --config-name F`` (``-cd``/``-cn``, ``=`` forms) names, when it
    exists (``D/F.yaml``); None otherwise (Hydra then reports what it cannot find)."""
    line = parse(argv)
    config_dir, config_name = line.value("--config-dir"), line.value("--config-name")
    if config_dir is None or config_name is None:
        return None
    name = config_name if config_name.endswith(".yaml") else config_name + ".yaml"
    file = Path(config_dir).expanduser() / name
    return file if file.is_file() else None


def user_file(argv: list[str]) -> Path | None:
    """The user's config file that a ``train.py`` command line (without the program) names, as the user named it:
    the file itself, not the link in :func:`config_dir_of`'s dir that ``automodel-hydra F.yaml`` runs through;
    None for the bundled config or a file that does not exist."""
    file = _named_file(argv) if _names_user_config(argv) else None
    return file.resolve() if file is not None else None


def _default_groups(defaults: tp.Any) -> set[str]:
    """The config groups a defaults list names (``- launcher: slurm``, ``- override launcher: x``,
    ``- optional sweep: y``)."""
    found = set()
    for entry in defaults if isinstance(defaults, list) else []:
        for key in entry if isinstance(entry, dict) else []:
            found.add(str(key).split()[-1].lstrip("/").split("@")[0])
    return found


def _typed_sections(sections: dict[str, tp.Any]) -> set[str]:
    """Top-level keys of a user's file that our schema types (``automodel_hydra.config``): every ``TrainConfig``
    field for a file of the bundled recipe (no ``recipe:``), else the sections this product reads whatever the
    recipe (:data:`automodel_hydra.sections.LAUNCH_KEYS`: ``seed`` among them), ``recipe:`` itself aside."""
    from automodel_hydra import config
    from automodel_hydra.sections import LAUNCH_KEYS, SECTIONS

    if sections.get("recipe") is None:
        return {f.name for f in dataclasses.fields(config.TrainConfig) if SECTIONS.get(f.name) != "filled"}
    return {k for k in LAUNCH_KEYS if SECTIONS[k] != "recipe"}


def from_file(path: str, rest: list[str]) -> list[str]:
    """``automodel-hydra F.yaml [args]`` as ``train.py`` arguments. Raises :class:`NoConfigFile` naming the file.

    The config dir Hydra searches is one that holds this file alone (:func:`config_dir_of`), not the file's own
    dir: there, every subdir (``outputs/``, ``multirun/`` of past runs, anything else) would be a config group,
    listed by ``--help`` and open to group overrides."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise NoConfigFile(f"{path}: no such config file")
    file = file.resolve()
    return for_user_config(["--config-dir", str(config_dir_of(file)), "--config-name", file.stem, *rest])


def config_dir_of(file: Path) -> Path:
    """A dir that holds only ``file`` (a symlink to it, so the file is read where it is, every time):
    ``<tmp>/automodel-hydra-<uid>/<hash of the file's path>/``, private to this user (0700; a dir there that is
    not this user's is never used: a fresh private one is made instead). Made once per file path and reused."""
    import hashlib
    import tempfile

    root = Path(tempfile.gettempdir()) / f"automodel-hydra-{os.getuid()}"
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        st = root.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(root)
    except OSError:
        root = Path(tempfile.mkdtemp(prefix="automodel-hydra-"))
    home = root / hashlib.sha256(str(file).encode()).hexdigest()[:16]
    home.mkdir(exist_ok=True)
    link = home / file.name
    if not (link.is_symlink() and os.readlink(link) == str(file)):
        tmp = home / f".{file.name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(file)
        os.replace(tmp, link)
    return home


# ----------------------------------------------------------------------------------------------- Hydra's flags


@dataclasses.dataclass(frozen=True)
class Flag:
    """One of Hydra's command-line flags: its names (the long one first) and what follows it."""

    names: tuple[str, ...]
    #: it takes a value: ``--name VALUE`` or ``--name=VALUE``
    value: bool = False
    #: an optional value, taken only when the next word is one of these (argparse's ``nargs="?"`` with choices)
    choices: tuple[str, ...] = ()
    #: one of the modes a command runs in, of which Hydra takes one at a time
    mode: bool = False

    @property
    def name(self) -> str:
        return self.names[0]


#: Hydra's own command-line flags, the one table of them (Hydra 1.3's argument parser, ``get_args_parser`` in
#: ``hydra/_internal/utils.py``, as ``python train.py --hydra-help`` lists it). ``-c`` is ``--cfg``; in AutoModel's
#: CLI shapes (``automodel-hydra finetune llm -c FILE``) ``-c`` names the config file, and :func:`from_automodel_cli`
#: reads it as that before this table.
HYDRA_FLAGS = (
    Flag(("--help", "-h")),
    Flag(("--hydra-help",)),
    Flag(("--version",)),
    Flag(("--cfg", "-c"), value=True, mode=True),
    Flag(("--resolve",)),
    Flag(("--package", "-p"), value=True),
    Flag(("--run", "-r"), mode=True),
    Flag(("--multirun", "-m"), mode=True),
    Flag(("--shell-completion", "-sc"), mode=True),
    Flag(("--config-path", "-cp"), value=True),
    Flag(("--config-name", "-cn"), value=True),
    Flag(("--config-dir", "-cd"), value=True),
    Flag(("--experimental-rerun",), value=True),
    Flag(("--info", "-i"), choices=("all", "config", "defaults", "defaults-tree", "plugins", "searchpath"), mode=True),
)
_FLAG_NAMED = {name: flag for flag in HYDRA_FLAGS for name in flag.names}


@dataclasses.dataclass(frozen=True)
class Given:
    """A Hydra flag as the command line gives it: the flag, its value (None: none given) and the words it took."""

    flag: Flag
    value: str | None
    words: tuple[str, ...]


def read_flag(argv: tp.Sequence[str], i: int) -> Given | None:
    """The Hydra flag at ``argv[i]`` with its value (``--name VALUE`` or ``--name=VALUE``), or None when
    ``argv[i]`` is not one of :data:`HYDRA_FLAGS` (an override, AutoModel's ``--a.b=c``). A value missing at the
    end of the line is None (Hydra's parser then says so)."""
    word = argv[i]
    name, eq, value = word.partition("=")
    flag = _FLAG_NAMED.get(name) if eq else _FLAG_NAMED.get(word)
    if flag is None or eq and not (flag.value or flag.choices):
        return None
    if eq:
        return Given(flag, value, (word,))
    following = argv[i + 1] if i + 1 < len(argv) else None
    if following is not None and (flag.value or following in flag.choices):
        return Given(flag, following, (word, following))
    return Given(flag, None, (word,))


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """A ``train.py`` command line (without the program), read once (:func:`parse`): ``items`` in their order,
    each a :class:`Given` Hydra flag or another word (an override, AutoModel's ``--a.b=c``)."""

    items: tuple[Given | str, ...]

    @property
    def flags(self) -> list[Given]:
        return [item for item in self.items if isinstance(item, Given)]

    @property
    def words(self) -> list[str]:
        """Every word that is not a Hydra flag or its value, in order."""
        return [item for item in self.items if isinstance(item, str)]

    @property
    def overrides(self) -> list[str]:
        """The overrides (``key=value``, ``+key=v``, ``~key``: words not starting with ``-``), in order."""
        return [w for w in self.words if not w.startswith("-")]

    def given(self, name: str) -> Given | None:
        """The flag whose long name is ``name`` (``--multirun``), as given last; None when it is not given."""
        return next((g for g in reversed(self.flags) if g.flag.name == name), None)

    def value(self, name: str) -> str | None:
        given = self.given(name)
        return None if given is None else given.value

    def hydra_order(self) -> list[str]:
        """The words in the order Hydra's parser reads them all: the flags first (each with its value), then the
        other words; a flag whose value is optional and not given comes last (before an override, argparse would
        take the override for its value)."""
        late = [g for g in self.flags if g.flag.choices and g.value is None]
        first = [w for g in self.flags if g not in late for w in g.words]
        return first + self.words + [w for g in late for w in g.words]

    def usage_problem(self) -> str | None:
        """Hydra's rules for its flags, which it reports as a traceback: one line, or None when they hold. More than
        one mode (``--run``, ``--multirun``, ``--cfg``, ``--info``, ``--shell-completion``: "Only one of ... can be
        specified"), and ``--resolve`` without ``--cfg`` or ``--help`` (``_run_hydra``, hydra/_internal/utils.py)."""
        modes = {g.flag.name: " ".join(g.words) for g in self.flags if g.flag.mode}
        if len(modes) > 1:
            return (f"{' and '.join(modes.values())}: Hydra runs one of --run, --multirun, --cfg, --info, "
                    "--shell-completion at a time: keep one")
        if self.given("--resolve") and not (self.given("--cfg") or self.given("--help")):
            return "--resolve: it applies to --cfg or --help only: add --cfg job (or drop --resolve)"
        return None


def parse(argv: tp.Sequence[str]) -> CommandLine:
    """The command line ``argv`` (without the program), Hydra's flags told apart (:data:`HYDRA_FLAGS`)."""
    items: list[Given | str] = []
    i = 0
    while i < len(argv):
        given = read_flag(argv, i)
        items.append(argv[i] if given is None else given)
        i += 1 if given is None else len(given.words)
    return CommandLine(tuple(items))


def hydra_flags_first(argv: list[str]) -> list[str]:
    """``argv`` (without the program) with Hydra's own flags (``-m``, ``--cfg job``, ``-cd D`` ...) moved before
    the overrides, each flag's value with it, order otherwise kept: ``a=1 -m b=1,2`` -> ``-m a=1 b=1,2``
    (:meth:`CommandLine.hydra_order`).

    Hydra reads its command line with argparse, where the overrides are one positional list (``nargs="*"``): an
    option between two overrides ends that list, and the overrides after it are "unrecognized arguments"
    (Python's argparse docs, ``parse_intermixed_args``, which Hydra does not use). Here a flag may come anywhere,
    as the README's usage lines write it."""
    return parse(argv).hydra_order()


# ----------------------------------------------------------------------------------------------- AutoModel's CLI

#: AutoModel's older CLI (``automodel <command> <domain> -c FILE``, ``nemo_automodel/_cli/app.py`` up to the
#: release that had its Slurm launcher) ran ``nemo_automodel/recipes/<domain>/<script>.py``'s ``main()``, the
#: script named by ``COMMAND_ALIASES = {"finetune": "train_ft", "pretrain": "train_ft", "benchmark": "benchmark"}``
#: (``kd`` -> ``kd.py``); each ``main()`` runs one recipe class, named here. ``finetune vlm`` is the VLM
#: fine-tuning recipe of ``recipes/vlm/finetune.py`` (the alias named a ``vlm/train_ft.py`` that AutoModel never had).
COMMAND_RECIPES = {
    ("finetune", "llm"): "TrainFinetuneRecipeForNextTokenPrediction",
    ("pretrain", "llm"): "TrainFinetuneRecipeForNextTokenPrediction",
    ("kd", "llm"): "KnowledgeDistillationRecipeForNextTokenPrediction",
    ("benchmark", "llm"): "BenchmarkingRecipeForNextTokenPrediction",
    ("finetune", "vlm"): "FinetuneRecipeForVLM",
    ("kd", "vlm"): "KnowledgeDistillationRecipeForVLM",
}
COMMANDS = ("finetune", "pretrain", "kd", "benchmark")
DOMAINS = ("llm", "vlm")
_NPROC = ("--nproc-per-node", "--nproc_per_node")
#: an override: ``key=value``, ``+key=v``, ``++key=v``, ``~key=v``, a group choice ``a/b=c``
_OVERRIDE = re.compile(r"^[~+]*[A-Za-z_@][\w.\-/@]*=")


class UsageError(UserError, ValueError):
    """An AutoModel command line that cannot mean here what it meant there; the message is one line saying what to
    write instead."""


class NoConfigFile(UsageError, FileNotFoundError):
    """The config file the command line names does not exist; the message names it."""


def is_automodel_cli(argv: list[str]) -> bool:
    """Whether ``argv`` (without the program) is one of AutoModel's CLI shapes: a config file (a ``.yaml``/``.yml``
    argument, or ``-c``/``--config FILE``), or AutoModel's ``<command> <domain>`` words first."""
    return bool(argv) and (argv[0] in COMMANDS or any(a in ("-c", "--config") or a.startswith("--config=")
                                                       or not a.startswith("-") and a.endswith((".yaml", ".yml"))
                                                       for a in argv))


def from_automodel_cli(argv: list[str]) -> list[str]:
    """AutoModel's command lines as ``train.py`` arguments (:func:`from_file`), with AutoModel's meaning:

    * ``F.yaml`` (HEAD) or ``<command> <domain> -c F.yaml`` (the older CLI; ``--config F.yaml``), flags before or
      after the file;
    * ``--nproc-per-node N`` / ``--nproc_per_node N`` / ``--nproc-per-node=N``: ranks of a local run
      (``interactive.nproc_per_node``);
    * ``--a.b=c`` and ``--a.b c`` set a key (adding it when the file lacks it), a bare ``--flag`` sets it true
      (AutoModel's ``parse_cli_argv``); Hydra's own arguments (``a.b=c``, ``-m``, ``--cfg job`` ...) pass through;
    * the command and domain choose the recipe (:data:`COMMAND_RECIPES`) when the file names none.

    Raises UsageError (one line, what to write instead): no file; an unknown command or domain; a command whose
    recipe differs from the file's ``recipe:``; ``--nproc-per-node`` with a ``slurm:`` or ``skypilot:`` section
    (AutoModel ignored it there); a file without ``recipe:`` whose sections are AutoModel's and no command.
    :class:`NoConfigFile` when the file does not exist."""
    file: str | None = None
    nproc: str | None = None
    words: list[str] = []
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        name, eq, value = a.partition("=")
        if a in ("-c", "--config") or name == "--config" and eq:
            if not eq and nxt is None:
                raise UsageError(f"{a} needs the config file: {a} FILE.yaml")
            file, i = (value, i + 1) if eq else (tp.cast(str, nxt), i + 2)
            continue
        if name in _NPROC:
            if not eq and nxt is None:
                raise UsageError(f"{a} needs a number of ranks: {a} N")
            nproc, i = (value, i + 1) if eq else (tp.cast(str, nxt), i + 2)
            continue
        given = read_flag(argv, i)
        if given is not None:  # Hydra's own, passed on as given
            out += given.words
            i += len(given.words)
            continue
        if a.startswith("--") and len(a) > 2:  # AutoModel's --a.b=c, --a.b c, --flag
            if eq:
                out.append(f"++{name[2:]}={value}")
            elif nxt is not None and not nxt.startswith("-") and not _OVERRIDE.match(nxt) and not (
                    file is None and nxt.endswith((".yaml", ".yml"))):
                out.append(f"++{a[2:]}={nxt}")
                i += 1
            else:
                out.append(f"++{a[2:]}=true")
        elif not a.startswith("-") and "=" not in a and file is None and a.endswith((".yaml", ".yml")):
            file = a
        elif not a.startswith("-") and "=" not in a and len(words) < 2 and not out:
            words.append(a)
        else:
            out.append(a)
        i += 1
    command = None
    if words:
        if words[0] not in COMMANDS or len(words) < 2 or words[1] not in DOMAINS:
            raise UsageError(f"{' '.join(words)}: AutoModel's CLI form is <command> <domain> -c FILE.yaml, with "
                             f"<command> one of {', '.join(COMMANDS)} and <domain> one of {', '.join(DOMAINS)}; "
                             "or name the file alone: automodel-hydra FILE.yaml")
        command = (words[0], words[1])
        if command not in COMMAND_RECIPES:
            raise UsageError(f"{' '.join(command)}: AutoModel has no {command[0]} recipe for {command[1]}; name the "
                             "recipe in the file (recipe: CLASS) and run automodel-hydra FILE.yaml")
    if file is None:
        shown = f"{' '.join(command)} " if command else ""
        raise UsageError(f"no config file: automodel-hydra {shown}-c FILE.yaml (or automodel-hydra FILE.yaml)")
    path = Path(file).expanduser()
    if not path.is_file():
        raise NoConfigFile(f"{file}: no such config file")
    sections = _top_level(path)
    recipe = sections.get("recipe")
    if command is not None:
        wanted = COMMAND_RECIPES[command]
        if recipe is None:
            out.append(f"++recipe={wanted}")
        elif _class_name(recipe) != wanted:
            raise UsageError(f"{file} names recipe: {_class_name(recipe)}, and `{' '.join(command)}` means "
                             f"{wanted}: run automodel-hydra {file} (the file's recipe), or change its recipe:")
    elif recipe is None and _looks_like_automodel(sections):
        raise UsageError(f"{file} names no recipe: and its sections are AutoModel's: run it as AutoModel's older "
                         f"CLI did, automodel-hydra finetune llm -c {file} (or kd/benchmark/pretrain, llm/vlm), or "
                         "add a line recipe: TrainFinetuneRecipeForNextTokenPrediction")
    if nproc is not None:
        from automodel_hydra.sections import LAUNCHER_SECTIONS

        launcher = next((s for s in LAUNCHER_SECTIONS if sections.get(s) is not None), None)
        if launcher is not None:
            where = "slurm.ntasks_per_node" if launcher == "slurm" else "skypilot.gpus_per_node"
            raise UsageError(f"--nproc-per-node sets the ranks of a local run, and {file} has a {launcher}: section "
                             f"(AutoModel ignored the flag there): write --{where}={nproc}")
        out.append(f"++interactive.nproc_per_node={nproc}")
    return from_file(str(path), out)


def _top_level(path: Path) -> dict[str, tp.Any]:
    """The file's top-level mapping as YAML reads it (``{}`` when it is not a mapping)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return {}  # Hydra reports the file's syntax error itself, naming the line
    return data if isinstance(data, dict) else {}


def _class_name(recipe: tp.Any) -> str:
    target = recipe.get("_target_") if isinstance(recipe, dict) else recipe
    return str(target).replace(":", ".").rsplit(".", 1)[-1]


def _looks_like_automodel(sections: dict[str, tp.Any]) -> bool:
    """Whether a file without ``recipe:`` holds sections only AutoModel's recipes read: a top-level section the
    bundled recipe does not have, or a ``_target_`` anywhere (AutoModel's loader instantiates them)."""
    from automodel_hydra.config import TrainConfig
    from automodel_hydra.sections import SECTIONS

    ours = {f.name for f in dataclasses.fields(TrainConfig)} | set(SECTIONS) | {"defaults"}  # Hydra's defaults list

    def targets(value: tp.Any) -> bool:
        if isinstance(value, dict):
            return "_target_" in value or any(targets(v) for v in value.values())
        return isinstance(value, list) and any(targets(v) for v in value)

    return any(k not in ours for k in sections) or targets(sections)
