"""Code snapshots: the code a submission's jobs run, copied when it is submitted, so that a job that waits in the
queue runs what was submitted, not what the checkout holds when it starts.

Names and behaviour are the neighbours': NeMo-Run's ``GitArchivePackager`` (the git tree at HEAD; ``git
archive``) and submitit's ``RsyncSnapshot`` (a directory copied into the job's folder, the job started from the
copy). Modes (``slurm.snapshot``):

* ``git``: the files of the git work tree that holds the submitting dir, as they are now: every tracked file
  (its working-tree content, so uncommitted changes go too), the tracked files of every checked-out submodule
  (``git ls-files --cached --recurse-submodules``, as NeMo-Run's ``GitArchivePackager`` can include submodules: a
  vendored ``third_party/Megatron-LM`` is code the recipe imports), and every untracked file git does not ignore
  (``git ls-files --others --exclude-standard``, in the work tree and in each submodule's). That is ``git archive
  HEAD`` with the working tree's diffs and new files applied. The record keeps the commit (``git rev-parse
  HEAD``), each submodule's, and whether the tree differed from it (``git status --porcelain``, which reports a
  submodule with changes too).
* ``copy``: the submitting dir itself, every file except hidden ones (``.git``, ``.venv`` ...) and
  ``__pycache__``.
* ``none``: no snapshot; the jobs import the code where it is when they start (the behaviour before snapshots).
* ``auto`` (the default): ``git`` inside a git work tree, else ``copy``.

Both modes leave out Hydra's own output dirs (a dir holding ``.hydra/`` or ``multirun.yaml``) and refuse a
snapshot larger than ``slurm.snapshot_max_mb`` before anything is submitted (a run started from a home dir full of
data should not copy it per submission). Both refuse, before anything is submitted, a snapshot that lacks a module
this process imported from the snapshot's root (:func:`missing_modules`: the recipe and what it imports were
imported here at plan time, and the ranks import the copy): a file git ignores (a generated ``_version.py``, a
built extension), a submodule that is not checked out. A job known to fail at import is never queued.

Where it goes: ``<launch dir>/code/`` of the run, and for a sweep of the sweep dir (one copy for all its jobs).
Layout: ``code/src/`` is the snapshot root (the git top level, or the submitting dir); when this project's own
package (``automodel_hydra``) lies outside it, ``code/lib/automodel_hydra/`` holds a copy of it, so the ranks
run the launcher's code of the submission too. The ranks put the copy of the submitting dir (and of this
project) first on ``PYTHONPATH`` with ``PYTHONSAFEPATH=1`` (Python >= 3.11: the dir a rank starts in is not put
on ``sys.path``), and start where they always start, so relative data and checkpoint paths keep their meaning.

:func:`find` reads this machine (git, the filesystem) and runs in a backend's ``preflight``; at submit time the
backend puts :func:`members` where the cluster reads them (:func:`write`: on this machine). Planning only reads the
:class:`Source` that :func:`find` returned.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import typing as tp
from pathlib import Path

from automodel_hydra import records
from automodel_hydra.schema import ConfigError

if tp.TYPE_CHECKING:
    from automodel_hydra.config import TrainConfig

#: ``slurm.snapshot``'s values.
MODES = ("auto", "git", "copy", "none")
#: The snapshot's dir name under a launch dir, and its two parts.
CODE_DIR = "code"
SRC_DIR = "src"
LIB_DIR = "lib"
#: This project's package, copied beside a snapshot root that does not hold it.
PACKAGE = "automodel_hydra"
#: The variables a job that runs a snapshot exports (the batch script): the snapshot's source dir on the submitting
#: machine, and its copy (``<code dir>/src``) where the job runs. A call job maps its pickled ``sys.path`` with them
#: (:func:`remap`); a rank's import error names the copy.
CODE_ROOT_VAR = "AUTOMODEL_CODE_ROOT"
CODE_SRC_VAR = "AUTOMODEL_CODE_SRC"
#: Dir names never copied in ``copy`` mode (besides hidden ones).
_SKIP_DIRS = frozenset({"__pycache__"})


class SnapshotError(ConfigError):
    """A snapshot cannot be taken as configured (too large, not a git work tree, git missing)."""


@dataclasses.dataclass(frozen=True)
class Source:
    """What a submission snapshots: ``files`` (relative to ``root``), read now; ``cwd`` is the submitting dir
    (inside ``root``); ``project_root`` the dir that holds this project's package here. ``commit``/``dirty``:
    git mode only (``commit`` None in a repository without commits). ``size`` in bytes."""

    kind: str
    root: Path
    cwd: Path
    project_root: Path
    commit: str | None = None
    dirty: bool | None = None
    files: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)
    size: int = 0
    #: git mode: ``(path, commit)`` of each checked-out submodule, as ``git submodule status --recursive`` lists them
    submodules: tuple[tuple[str, str], ...] = ()

    @property
    def project_inside(self) -> bool:
        """Whether the snapshot root holds this project's package (then the snapshot's copy of it is used)."""
        return self.project_root == self.root or self.root in self.project_root.parents

    def pythonpath(self, code_dir: Path) -> list[str]:
        """The ``PYTHONPATH`` entries the ranks put first, for a snapshot at ``code_dir``: the copy of the
        submitting dir, then the copy of this project's root (or ``lib/``)."""
        src = code_dir / SRC_DIR
        entries = [src / self.cwd.relative_to(self.root)]
        entries.append(src / self.project_root.relative_to(self.root) if self.project_inside else code_dir / LIB_DIR)
        return list(dict.fromkeys(os.path.normpath(e) for e in entries))

    def record(self, code_dir: Path) -> dict[str, tp.Any]:
        """What the submission record says about the code its jobs run."""
        return {"snapshot": self.kind, "dir": str(code_dir), "source": str(self.root), "commit": self.commit,
                "dirty": self.dirty, "files": len(self.files), "bytes": self.size,
                **({"submodules": dict(self.submodules)} if self.submodules else {})}


def resolve_mode(mode: str, cwd: Path) -> str:
    """``auto`` -> ``git`` when ``cwd`` is inside a git work tree, else ``copy``; other modes as they are."""
    if mode != "auto":
        return mode
    return "git" if _git(cwd, "rev-parse", "--is-inside-work-tree", check=False) == "true" else "copy"


def find_each(cfgs: tp.Sequence[TrainConfig]) -> dict[tuple[str, float], Source | None]:
    """What each distinct ``slurm.snapshot`` setting of ``cfgs`` snapshots from this dir (:func:`find`; a container
    job that mounts this project's source itself: none), keyed ``(slurm.snapshot, slurm.snapshot_max_mb)``.
    Raises SnapshotError (a ConfigError) naming the field: too large, not a git work tree."""
    from automodel_hydra.plan import JobSpec

    out: dict[tuple[str, float], Source | None] = {}
    for cfg in cfgs:
        sc = cfg.slurm
        assert sc is not None
        key = (sc.snapshot, sc.snapshot_max_mb)
        live = sc.container_image is not None and sc.nemo_mount and sc.nemo_volume is None
        if key not in out and not live:  # (live: nemo_mount mounts this project's source itself)
            out[key] = find(sc.snapshot, Path.cwd(), JobSpec.project_root, sc.snapshot_max_mb,
                            exclude=[Path(cfg.output_dir)])
    return out


def find(mode: str, cwd: Path, project_root: Path, max_mb: float, key: str = "slurm.snapshot",
         exclude: tp.Iterable[Path] = ()) -> Source | None:
    """What ``mode`` snapshots from the submitting dir ``cwd`` (None for ``none``). ``exclude``: dirs left out
    (the run's own output dirs). Reads git and the filesystem.

    Raises
    ------
    SnapshotError
        naming ``key``: ``git`` outside a git work tree or without git, or a snapshot over ``max_mb`` MiB.
    """
    cwd, project_root = Path(cwd).resolve(), Path(project_root).resolve()
    mode = resolve_mode(mode, cwd)
    if mode == "none":
        return None
    skip = [Path(p).resolve() for p in exclude]
    limit = int(max_mb * 2**20)
    if mode == "git":
        top = _git(cwd, "rev-parse", "--show-toplevel", check=False)
        if not top:
            raise SnapshotError(key, mode, f"a git work tree: {cwd} is not inside one (or git is not installed); "
                                "use copy (this dir as it is) or none")
        root = Path(top).resolve()
        submodules = _submodule_commits(root)
        listed = _git_files(root, submodules)
        outputs = {str(d) for d in map(_output_dir_of, listed) if d is not None} - {"."}
        files, size = [], 0
        for rel in filter(None, listed):
            path = root / rel
            parents = {str(p) for p in Path(rel).parents}
            if parents & outputs or any(s == path or s in path.parents for s in skip):
                continue
            if not (path.is_file() or path.is_symlink()):  # deleted in the work tree, or a submodule's dir
                continue
            files.append(rel)
            size += path.lstat().st_size
            _check_size(size, limit, key, mode, root)
        head = _git(root, "rev-parse", "--verify", "-q", "HEAD", check=False) or None
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=normal", check=False))
        source = Source("git", root, cwd, project_root, head, dirty, tuple(files), size,
                        tuple(sorted(submodules.items())))
        _check_imports(source, key, mode)
        return source
    files, size = [], 0
    for dirpath, dirnames, filenames in os.walk(cwd):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS
                             and (here / d) not in skip and not _is_output_dir(here / d))
        links = [d for d in dirnames if (here / d).is_symlink()]  # os.walk lists them, does not enter them
        for name in sorted([*filenames, *links]):
            path = here / name
            if name.startswith(".") or not (path.is_file() or path.is_symlink()):
                continue
            files.append(str(path.relative_to(cwd)))
            size += path.lstat().st_size
            _check_size(size, limit, key, mode, cwd)
    source = Source("copy", cwd, cwd, project_root, None, None, tuple(files), size)
    _check_imports(source, key, mode)
    return source


def _git_files(root: Path, submodules: tp.Iterable[str]) -> list[str]:
    """What ``git`` mode snapshots of the work tree at ``root``, relative to it: the tracked files, the checked-out
    ``submodules``' tracked files (``--recurse-submodules``, which git supports for ``--cached`` only), and the
    untracked files git does not ignore, of the work tree and of each submodule (git-ls-files(1))."""
    listed = [f for f in _git(root, "ls-files", "-z", "--cached", "--recurse-submodules").split("\0") if f]
    for sub in ["", *submodules]:
        where = root / sub if sub else root
        others = _git(where, "ls-files", "-z", "--others", "--exclude-standard", check=False).split("\0")
        listed += [f"{sub}/{f}" if sub else f for f in others if f]
    return list(dict.fromkeys(listed))


def _submodule_commits(root: Path) -> dict[str, str]:
    """``path -> commit`` of every checked-out submodule of ``root``, nested ones included (``git submodule status
    --recursive``: a ``-`` prefix marks one that is not checked out, which is left out)."""
    out = {}
    for line in _git(root, "submodule", "status", "--recursive", check=False).splitlines():
        # "<flag><sha1> <path> (<describe>)", flag one of " +-U" (git-submodule(1), status)
        m = re.match(r"([ +U-]?)([0-9a-f]{7,64}) (.+?)(?: \([^)]*\))?$", line)
        if m and m.group(1) != "-":
            out[m.group(3)] = m.group(2)
    return out


def _environment_dirs() -> list[str]:
    """Where this interpreter's installed packages and standard library live (a virtualenv inside a repo is the
    environment, not the repo's code: the ranks import it where it is)."""
    import site
    import sys
    import sysconfig

    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(), site.getusersitepackages(),
            *(sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib"))}
    return [os.path.realpath(d) for d in dirs if d]


def missing_modules(source: Source, modules: tp.Mapping[str, tp.Any]) -> list[tuple[str, str]]:
    """``(module name, path relative to the snapshot root)`` of each module in ``modules`` (``sys.modules``) whose
    file lies under ``source.root`` but is not in the snapshot; sorted by path. Modules of the interpreter's
    environment (:func:`_environment_dirs`), ``__main__``, a module without an absolute ``__file__``, and this
    project's package when it is copied beside the root (``lib/``) are not the snapshot's."""
    root = os.path.realpath(source.root)
    have = set(source.files)
    env = _environment_dirs()
    package = os.path.realpath(source.project_root / PACKAGE)
    found: dict[str, str] = {}
    for name, module in list(modules.items()):
        file = getattr(module, "__file__", None)
        if name == "__main__" or not isinstance(file, str) or not os.path.isabs(file):
            continue  # (a relative __file__, as torch.classes' "_classes.py", is no path in any dir)
        path = os.path.realpath(file)
        if not path.startswith(root + os.sep) or any(path.startswith(d + os.sep) for d in env):
            continue
        if not source.project_inside and path.startswith(package + os.sep):
            continue
        rel = os.path.relpath(path, root)
        if rel not in have and "__pycache__" not in Path(rel).parts:
            found.setdefault(rel, name)
    return sorted(((name, rel) for rel, name in found.items()), key=lambda item: item[1])


def _check_imports(source: Source, key: str, mode: str) -> None:
    """Raise SnapshotError (one line, naming ``key``) when the snapshot lacks a module this process imported from
    its root (:func:`missing_modules`)."""
    import sys

    missing = missing_modules(source, sys.modules)
    if not missing:
        return
    (name, rel), more = missing[0], len(missing) - 1
    others = f" and {more} more" if more else ""
    why = ("git does not track it or ignores it: git add it (or check out the submodule that holds it), or set "
           "copy (this dir as it is)" if source.kind == "git" else "copy leaves out hidden dirs: run from the dir "
           "that holds the code")
    raise SnapshotError(key, mode, f"the snapshot of {source.root} lacks {rel} (module {name}, imported here)"
                        f"{others}, and the ranks import the snapshot's copy; {why}, or none (the ranks import the "
                        "live checkout)")


def members(source: Source) -> dict[str, Path]:
    """What a snapshot dir holds: its relative paths (``src/...``, and ``lib/automodel_hydra/...`` when the root
    does not hold this project) -> the files here they are copies of (a symlink stays a link)."""
    out = {f"{SRC_DIR}/{rel}": source.root / rel for rel in source.files}
    if not source.project_inside:
        package = source.project_root / PACKAGE
        for path in sorted(package.rglob("*")):
            if (path.is_file() or path.is_symlink()) and "__pycache__" not in path.parts and path.suffix != ".pyc":
                out[f"{LIB_DIR}/{PACKAGE}/{path.relative_to(package).as_posix()}"] = path
    return out


def write(source: Source, code_dir: Path) -> None:
    """Copy ``source`` to ``code_dir`` on this machine (:func:`members`), replacing an earlier snapshot there, as
    ``Slurm.submit`` does through its transport: the copy is made beside it and renamed into place, so a snapshot
    is never half there. Raises OSError when a file cannot be read or written."""
    from pathlib import PurePosixPath

    from automodel_hydra.backends.slurm_transport import HERE

    there = PurePosixPath(code_dir)
    tmp = there.with_name(f".{there.name}.{os.getpid()}.tmp")
    HERE.put({tmp / rel: origin for rel, origin in members(source).items()}, dirs=[tmp / SRC_DIR],
             renames=[(tmp, there)])


def remap(path: str, source_root: str, code_src: str) -> str:
    """A path of the submitting machine under ``source_root`` as the same path under the snapshot's ``src/``
    (``code_src``); any other path as it is. Used by a call job for the ``sys.path`` it was pickled against."""
    norm = os.path.normpath(path or ".")
    if norm == source_root or norm.startswith(source_root.rstrip("/") + "/"):
        return os.path.normpath(os.path.join(code_src, os.path.relpath(norm, source_root)))
    return path


#: Files that mark a run's or a sweep's dir (Hydra's and ours): such a dir is output, never code.
_MARKERS = ((".hydra", "config.yaml"), ("multirun.yaml",), ("launch", "sbatch.sh"), *records.MARKERS)


def _output_dir_of(rel: str) -> Path | None:
    """The run or sweep dir a listed file marks (``R/.hydra/config.yaml`` -> ``R``), else None."""
    parts = Path(rel).parts
    for marker in _MARKERS:
        if parts[-len(marker):] == marker:
            return Path(*parts[:-len(marker)]) if len(parts) > len(marker) else Path(".")
    return None


def _is_output_dir(path: Path) -> bool:
    return any(path.joinpath(*marker).is_file() for marker in _MARKERS)


def _check_size(size: int, limit: int, key: str, mode: str, root: Path) -> None:
    if size > limit:
        raise SnapshotError(key, mode, f"a snapshot of at most {key}_max_mb={limit / 2**20:g} MiB; {root} has more "
                            f"(over {size / 2**20:.0f} MiB read so far): raise {key}_max_mb, run from the dir that "
                            "holds the code, or set none")


def _git(cwd: Path, *args: str, check: bool = True) -> str:
    """``git -C cwd ARGS``' stdout, stripped ('' when git fails and ``check`` is false). Raises SnapshotError
    when ``check`` and git fails."""
    try:
        proc = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        if check:
            raise SnapshotError("slurm.snapshot", "git", f"a working git ({e})") from None
        return ""
    if proc.returncode != 0:
        if check:
            raise SnapshotError("slurm.snapshot", "git", f"a readable git work tree (git {args[0]}: "
                                f"{proc.stderr.strip().splitlines()[-1:] or proc.returncode})")
        return ""
    return proc.stdout if "-z" in args else proc.stdout.strip()
