"""Command lines that name a config file of the user's own (an AutoModel YAML, unchanged), adapted for Hydra.

Both shapes run the file with our launcher and output dirs, without a line added to the file:

* ``python train.py --config-dir D --config-name F [overrides]`` (Hydra's own shape);
* ``automodel-hydra F.yaml [--a.b=c | a.b=c ...] [-m]`` (AutoModel's CLI shape: ``automodel cfg.yaml --a.b=c``).

What :func:`for_user_config` adds, each only when the command line does not set it already: our Hydra launcher
(``hydra/launcher=automodel``, so ``-m`` becomes one Slurm job array) and sweeper (``automodel_basic``), and our
run and sweep dirs (one dir per
command); ``dry_run=X`` becomes ``++dry_run=X`` (a user's file has no ``dry_run`` key), and AutoModel's
``--a.b=c`` becomes Hydra's ``++a.b=c`` (set, adding the key when the file lacks it, as AutoModel's CLI does).
"""

from __future__ import annotations

from pathlib import Path

#: Our default dirs (conf/hydra/automodel.yaml has the same for the bundled config).
RUN_DIR = "outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}-${automodel_uid:}"
SWEEP_DIR = "multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}-${automodel_uid:}"


def _names_user_config(argv: list[str]) -> bool:
    return any(a in ("--config-name", "-cn") or a.startswith(("--config-name=", "-cn=")) for a in argv)


def for_user_config(argv: list[str]) -> list[str]:
    """``argv`` (without the program) adapted as the module docstring says; unchanged when no user config is named."""
    if not _names_user_config(argv):
        return argv
    out = []
    for a in argv:
        if a.startswith("--") and "=" in a and not a.startswith(("--config", "--cfg", "--package", "--info",
                                                                    "--experimental")):
            a = "++" + a[2:]  # AutoModel's --a.b=c
        elif a.startswith("dry_run="):
            a = "++" + a
        out.append(a)
    keys = {a.split("=", 1)[0].lstrip("+~") for a in out if "=" in a}
    if "hydra/launcher" not in keys:
        out.append("hydra/launcher=automodel")
    if "hydra/sweeper" not in keys:
        out.append("hydra/sweeper=automodel_basic")
    if "hydra.run.dir" not in keys:
        out.append(f"hydra.run.dir={RUN_DIR}")
    if "hydra.sweep.dir" not in keys:
        out.append(f"hydra.sweep.dir={SWEEP_DIR}")
    return out


def from_file(path: str, rest: list[str]) -> list[str]:
    """``automodel-hydra F.yaml [args]`` as ``train.py`` arguments. Raises FileNotFoundError naming the file."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no such config file")
    file = file.resolve()
    return for_user_config(["--config-dir", str(file.parent), "--config-name", file.stem, *rest])
