"""``automodel_hydra.backends.slurm_states.query`` against recorded ``sacct``/``squeue`` outputs.

The outputs below were printed by Slurm 22.05.8 (the project's test cluster) for the situations named; fake
``sacct``/``squeue`` executables on PATH print them back and record how they were called.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from automodel_hydra.backends.slurm_states import NotAnswered, expand_array_id, lookup, parse_sacct, query, runner
from automodel_hydra.backends.slurm_transport import HERE
from automodel_hydra.states import JobState, StateInfo

# sacct -X --parsable2 --noheader -o JobID,State,Reason -j 12 (array 0-19%2, 1.5 s after submission + 8 s later)
SACCT_ARRAY = """12_0|COMPLETED|None
12_1|COMPLETED|None
12_2|RUNNING|JobArrayTaskLimit
12_3|RUNNING|JobArrayTaskLimit
12_[4-19%2]|PENDING|JobArrayTaskLimit
"""
# squeue --noheader --states=all -o '%i|%T|%r' -j 12, the same moment: slurmctld is ahead of accounting
SQUEUE_ARRAY = """12_[5-19%2]|PENDING|JobArrayTaskLimit
12_4|RUNNING|None
12_3|COMPLETED|None
12_2|COMPLETED|None
12_1|COMPLETED|None
12_0|COMPLETED|None
"""
# a job preempted under PreemptMode=REQUEUE: sacct shows the ended attempt, squeue the requeued job
SACCT_PREEMPTED = "2|PREEMPTED|None\n"
SQUEUE_REQUEUED = "2|PENDING|BeginTime\n"
SACCT_FINAL = "1|CANCELLED by 0|None\n6|PREEMPTED|None\n9|NODE_FAIL|None\n14|TIMEOUT|None\n15|OUT_OF_MEMORY|None\n"
ACCOUNTING_OFF = "sacct: error: Slurm accounting storage is disabled\n"


class FakeTools:
    """``sacct``/``squeue`` on PATH that print set outputs and log their argv (shell scripts: a fast test starts
    no Python interpreter, tests/tiers.py)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = root / "calls.log"  # a call's words end with \037 each, a call with \036
        (root / "bin").mkdir()
        for tool in ("sacct", "squeue"):
            exe = root / "bin" / tool
            at = shlex.quote(str(root))
            exe.write_text(
                f"#!/bin/sh\n{{ for word in {tool} \"$@\"; do printf '%s\\037' \"$word\"; done; printf '\\036'; }} "
                f">> {at}/calls.log\n"
                f"cat {at}/{tool}.out; cat {at}/{tool}.err >&2; exit \"$(cat {at}/{tool}.rc)\"\n"
            )
            exe.chmod(0o755)
            self.set(tool, "")

    def set(self, tool: str, out: str, rc: int = 0, err: str = "") -> None:
        (self.root / f"{tool}.out").write_text(out)
        (self.root / f"{tool}.err").write_text(err)
        (self.root / f"{tool}.rc").write_text(str(rc))

    def calls(self) -> list[list[str]]:
        text = self.log.read_text() if self.log.exists() else ""
        return [call.split("\037")[:-1] for call in text.split("\036")[:-1]]


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeTools:
    fake = FakeTools(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    return fake


def test_one_sacct_call_for_all_ids_and_squeue_only_for_what_it_cannot_tell(tools: FakeTools) -> None:
    tools.set("sacct", SACCT_ARRAY + SACCT_FINAL)
    tools.set("squeue", SQUEUE_ARRAY)
    ids = ["12_0", "12_3", "12_4", "12_17", "1", "6", "14"]
    states = query(ids)
    assert states == {
        "12_0": StateInfo(JobState.COMPLETED),
        "12_3": StateInfo(JobState.COMPLETED),  # sacct still says RUNNING; squeue knows better
        "12_4": StateInfo(JobState.RUNNING),  # started since sacct's pending range was recorded
        "12_17": StateInfo(JobState.PENDING, "JobArrayTaskLimit"),
        "1": StateInfo(JobState.CANCELLED),
        "6": StateInfo(JobState.PREEMPTED),  # squeue has forgotten it: PREEMPTED is final
        "14": StateInfo(JobState.TIMEOUT),
    }
    sacct, *squeues = tools.calls()
    assert sacct == ["sacct", "-X", "--parsable2", "--noheader", "--format=JobID,State,Reason", "--jobs=1,6,12,14"]
    # squeue: once, about the array (live tasks) and the PREEMPTED job; never about the final 1 and 14
    assert squeues == [["squeue", "--noheader", "--states=all", "--format=%i|%T|%r", "--jobs=6,12"]]


def test_preempted_under_requeue_is_pending_not_final(tools: FakeTools) -> None:
    tools.set("sacct", SACCT_PREEMPTED)
    tools.set("squeue", SQUEUE_REQUEUED)
    assert query(["2"]) == {"2": StateInfo(JobState.PENDING, "BeginTime")}


def test_nothing_final_from_sacct_needs_no_squeue(tools: FakeTools) -> None:
    tools.set("sacct", "1|CANCELLED by 0|None\n14|TIMEOUT|None\n15|OUT_OF_MEMORY|None\n")
    assert query(["1", "14", "15"]) == {"1": StateInfo(JobState.CANCELLED), "14": StateInfo(JobState.TIMEOUT),
                                        "15": StateInfo(JobState.OUT_OF_MEMORY)}
    assert [c[0] for c in tools.calls()] == ["sacct"]


def test_accounting_off_falls_back_to_one_squeue_call(tools: FakeTools) -> None:
    tools.set("sacct", "", rc=1, err=ACCOUNTING_OFF)
    tools.set("squeue", "33|PENDING|Resources\n32|RUNNING|None\n31|COMPLETED|None\n")
    assert query(["31", "32", "33", "34"]) == {
        "31": StateInfo(JobState.COMPLETED), "32": StateInfo(JobState.RUNNING),
        "33": StateInfo(JobState.PENDING, "Resources"), "34": StateInfo(JobState.UNKNOWN)}
    assert [c[0] for c in tools.calls()] == ["sacct", "squeue"]


def test_a_job_no_tool_knows_is_unknown(tools: FakeTools) -> None:
    tools.set("sacct", "")
    tools.set("squeue", "", rc=1, err="slurm_load_jobs error: Invalid job id specified\n")
    assert query(["99999", "99999_3"]) == {"99999": StateInfo(JobState.UNKNOWN),
                                            "99999_3": StateInfo(JobState.UNKNOWN)}


def test_missing_tools_mean_unknown_not_an_exception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert query(["5"]) == {"5": StateInfo(JobState.UNKNOWN)}


def test_just_submitted_job_comes_from_squeue(tools: FakeTools) -> None:
    tools.set("sacct", "32|PENDING|None\n")  # accounting has 32, not yet 33
    tools.set("squeue", "33|PENDING|Priority\n32|RUNNING|None\n")
    assert query(["32", "33"]) == {"32": StateInfo(JobState.RUNNING), "33": StateInfo(JobState.PENDING, "Priority")}


@pytest.mark.parametrize("table, state, reason", [
    ({"12_0": "COMPLETED", "12_1": "RUNNING", "12_2": "PENDING"}, JobState.RUNNING, ""),
    ({"12_0": "COMPLETED", "12_1": "PENDING"}, JobState.PENDING, "JobArrayTaskLimit"),
    ({"12_0": "COMPLETED", "12_1": "COMPLETED"}, JobState.COMPLETED, ""),
    ({"12_0": "COMPLETED", "12_2": "TIMEOUT", "12_10": "FAILED"}, JobState.TIMEOUT, ""),
    ({"12_10": "FAILED", "12_9": "CANCELLED by 0", "12_0": "COMPLETED"}, JobState.CANCELLED, ""),  # by index
])
def test_a_whole_array(table: dict[str, str], state: JobState, reason: str) -> None:
    parsed = parse_sacct("".join(f"{k}|{v}|JobArrayTaskLimit\n" for k, v in table.items()))
    assert lookup(parsed, "12") == StateInfo(state, reason)
    assert lookup(parsed, "13") is None and lookup(parsed, "12_5") is None


def test_whole_array_query_from_recorded_outputs(tools: FakeTools) -> None:
    tools.set("sacct", SACCT_ARRAY)
    tools.set("squeue", SQUEUE_ARRAY)
    assert query(["12"]) == {"12": StateInfo(JobState.RUNNING)}


@pytest.mark.parametrize("job_id, expanded", [
    ("12_[4-7%2]", ["12_4", "12_5", "12_6", "12_7"]),
    ("12_[1,3-4,9]", ["12_1", "12_3", "12_4", "12_9"]),
    ("12_[0-8:4]", ["12_0", "12_4", "12_8"]),
    ("12_[5]", ["12_5"]),
    ("12_3", ["12_3"]),
    ("12", ["12"]),
    ("12_[a-b]", ["12_[a-b]"]),
])
def test_expand_array_id(job_id: str, expanded: list[str]) -> None:
    assert expand_array_id(job_id) == expanded


def test_reason_is_kept_for_pending_jobs_only() -> None:
    parsed = parse_sacct("12_0|COMPLETED|JobArrayTaskLimit\n13|PENDING|None\n14|PENDING|Dependency\n")
    assert parsed == {"12_0": StateInfo(JobState.COMPLETED), "13": StateInfo(JobState.PENDING),
                      "14": StateInfo(JobState.PENDING, "Dependency")}


def test_header_and_odd_lines_are_skipped() -> None:
    assert parse_sacct("JobID|State|Reason\n\nsacct: warning\n7|RUNNING|None\n7.batch|RUNNING|\n") == {
        "7": StateInfo(JobState.RUNNING)}


@pytest.mark.parametrize("bad", ["12-3", "abc", "12_", "12_[1-3]", "", " 12"])
def test_a_bad_id_is_refused_before_any_command(tools: FakeTools, bad: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"Slurm job id {bad!r}: expected")):
        query(["12", bad])
    assert tools.calls() == []


def test_no_ids_no_calls(tools: FakeTools) -> None:
    assert query([]) == {} and tools.calls() == []


# ----------------------------------------------------------------------------------------------- could not ask
NO_CONF = "squeue: fatal: Could not establish a configuration source\n"


def test_a_strict_query_tells_could_not_ask_from_knows_nothing(tools: FakeTools, monkeypatch) -> None:
    strict = runner(HERE, strict=True)
    tools.set("sacct", "", rc=1, err=NO_CONF.replace("squeue", "sacct"))
    tools.set("squeue", "", rc=1, err=NO_CONF)
    with pytest.raises(NotAnswered, match=r"^sacct on this machine exited 1: .*; squeue on this machine exited 1"):
        query(["5"], run=strict)
    assert query(["5"]) == {"5": StateInfo(JobState.UNKNOWN)}  # (not strict: the launcher's wait, as before)
    tools.set("squeue", "", rc=1, err="slurm_load_jobs error: Invalid job id specified\n")  # asked: knows nothing
    tools.set("sacct", "", rc=1, err=ACCOUNTING_OFF)
    assert query(["5"], run=strict) == {"5": StateInfo(JobState.UNKNOWN)}
    tools.set("sacct", "5|COMPLETED|None\n")  # accounting answers, the controller does not: sacct's word
    tools.set("squeue", "", rc=1, err=NO_CONF)
    assert query(["5"], run=strict) == {"5": StateInfo(JobState.COMPLETED)}
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    calls = len(tools.calls())
    with pytest.raises(NotAnswered, match="^SLURM_CONF=/nonexistent/slurm.conf is not a file"):
        query(["5"], run=strict)
    assert len(tools.calls()) == calls, "the tools, which would retry a missing slurm.conf for 60 s, are not run"
