"""Two users, one dir: the files we write take the modes the user's umask gives (a group-shared run dir under
``umask 002`` stays usable for the group), and another user's run dir is refused in one line naming its owner.
Real processes: a dry run under umask 002, and a second uid (``nobody``) where this test runs as root."""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra.records import LOCK_FILE as LOCK
from automodel_hydra.records import take_lock
from tests.helpers import ROOT


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.slow
def test_files_follow_the_umask(tmp_path: Path) -> None:
    run = tmp_path / "R"
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run}", "dry_run=true"],
                          capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.umask(0o002))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _mode(run / "launch" / "torchrun.sh") == 0o775  # the group may run it (old main: 0755)
    code = ("import os, sys; os.umask(0o002); from automodel_hydra.records import take_lock; "
            "from pathlib import Path; take_lock(Path(sys.argv[1]))")
    subprocess.run([sys.executable, "-c", code, str(run)], check=True, timeout=60, cwd=ROOT)
    assert _mode(run / "launch" / LOCK) == 0o664  # a teammate can take the lock (old main: 0644)


def _as_user(uid: int, fn: tp.Callable[[], object]) -> str:
    """Run ``fn`` in a forked process with ``uid`` (no exec: this interpreter may not be readable for that user);
    returns ``Type: message`` of what it raised, or ``ok``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            os.setgid(uid)
            os.setuid(uid)
            try:
                fn()
                text = "ok"
            except BaseException as e:
                text = f"{type(e).__name__}: {e}"
            os.write(w, text.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as a second user (nobody)")
def test_another_users_dir_is_refused_in_one_line_naming_the_owner(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    base = Path(tempfile.mkdtemp(prefix="shared-", dir="/tmp"))  # pytest's own tmp dirs are 0700: not shared
    os.chmod(base, 0o755)
    run = base / "R"
    (run / "launch").mkdir(parents=True)
    fd = take_lock(run)  # root's run, lock 0644 under umask 022
    try:
        for busy in (True, False):
            if not busy:
                fcntl.flock(fd, fcntl.LOCK_UN)
            line = _as_user(nobody, lambda: take_lock(run))
            assert "\n" not in line and "Traceback" not in line, line
            assert line.startswith(f"SubmitError: {run} belongs to user root"), line
            assert ("a run of theirs is using it" in line) is busy, line
    finally:
        os.close(fd)
        shutil.rmtree(base, ignore_errors=True)
