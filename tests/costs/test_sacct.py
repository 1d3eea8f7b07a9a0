"""Reading `sacct -P`: job grouping, TRES forms, requeues, and every bad-input error with its line."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from costs.sacct import SacctError, gpus_in_tres, parse

HEADER = "JobID|State|Submit|Start|End|TimelimitRaw|AllocTRES|ReqTRES"
T0 = "2025-03-01T10:00:00"
T1 = "2025-03-01T12:00:00"


def read(*lines: str, header: str = HEADER):
    return parse([header, *lines])


def by_id(acct):
    return {job.job_id: job for job in acct.jobs}


def test_steps_belong_to_their_job_and_are_not_counted_again():
    acct = read(f"7|COMPLETED|{T0}|{T0}|{T1}|60|gres/gpu=2|gres/gpu=2",
                f"7.batch|COMPLETED|{T0}|{T0}|{T1}||gres/gpu=2|",
                f"7.extern|COMPLETED|{T0}|{T0}|{T1}||billing=1|",
                f"7.0|COMPLETED|{T0}|{T0}|{T1}||gres/gpu=2|")
    assert [j.job_id for j in acct.jobs] == ["7"]
    assert acct.steps == 3
    assert acct.jobs[0].runs[0].gpus == 2


def test_array_tasks_are_jobs_and_a_pending_range_counts_each_task():
    acct = read(f"8_1|COMPLETED|{T0}|{T0}|{T1}|60|gres/gpu=1|gres/gpu=1",
                f"8_1.batch|COMPLETED|{T0}|{T0}|{T1}||gres/gpu=1|",
                f"8_[2-4,9%2]|PENDING|{T0}|Unknown|Unknown|60||gres/gpu=1")
    jobs = by_id(acct)
    assert set(jobs) == {"8_1", "8_[2-4,9%2]"}
    assert jobs["8_[2-4,9%2]"].count == 4  # 2, 3, 4 and 9; %2 is a throttle
    assert jobs["8_[2-4,9%2]"].runs[0].gpus == 1  # a pending job is known by what it asked for


def test_heterogeneous_components_are_one_job_with_their_gpus_added():
    acct = read(f"9+0|COMPLETED|{T0}|{T0}|{T1}|60|gres/gpu=1|",
                f"9+1|COMPLETED|{T0}|{T0}|2025-03-01T13:00:00|90|gres/gpu:a100=4,gres/gpu=4|",
                f"9+1.0|COMPLETED|{T0}|{T0}|{T1}||gres/gpu=4|")
    [job] = acct.jobs
    assert job.job_id == "9" and len(job.runs) == 1
    run = job.runs[0]
    assert run.gpus == 5
    assert run.end == datetime(2025, 3, 1, 13, tzinfo=UTC)
    assert run.limit_s == 90 * 60


def test_a_requeued_job_recorded_with_duplicates_keeps_each_run():
    acct = read(f"10|REQUEUED|{T0}|{T0}|{T1}|60|gres/gpu=1|",
                f"10.batch|CANCELLED|{T0}|{T0}|{T1}||gres/gpu=1|",
                f"10|COMPLETED|{T1}|{T1}|2025-03-01T13:00:00|60|gres/gpu=1|")
    [job] = acct.jobs
    assert [r.state for r in job.runs] == ["REQUEUED", "COMPLETED"]
    assert job.submit == datetime(2025, 3, 1, 10, tzinfo=UTC)  # submitted once, at its first Submit


@pytest.mark.parametrize(("tres", "gpus"), [
    ("billing=4,cpu=4,gres/gpu=2,mem=16G,node=1", 2),
    ("cpu=4,gres/gpu:a100=2,gres/gpu:h100=1", 3),  # typed only: summed
    ("gres/gpu:a100=2,gres/gpu=2", 2),  # the untyped total beside the typed entry: not twice
    ("cpu=4,mem=1000M,node=1", 0),
    ("", 0),
])
def test_gpu_counts_from_each_tres_form(tres: str, gpus: int):
    assert gpus_in_tres(tres, 1, "AllocTRES") == gpus


def test_the_parsable_form_with_a_trailing_delimiter_reads_the_same():
    plain = read(f"11|COMPLETED|{T0}|{T0}|{T1}|60|gres/gpu=1|")
    trailing = read(f"11|COMPLETED|{T0}|{T0}|{T1}|60|gres/gpu=1||", header=HEADER + "|")
    assert trailing.jobs == plain.jobs


def test_times_are_read_in_the_zone_given():
    acct = parse([HEADER, f"12|COMPLETED|{T0}|{T0}|{T1}|60|gres/gpu=1|"], ZoneInfo("Europe/Berlin"))
    assert acct.jobs[0].runs[0].start == datetime(2025, 3, 1, 9, tzinfo=UTC)


def test_a_running_job_lasts_until_its_elapsed_time():
    acct = parse(["JobID|State|Submit|Start|End|ElapsedRaw|TimelimitRaw|AllocTRES",
                  f"13|RUNNING|{T0}|{T0}|Unknown|7200|UNLIMITED|gres/gpu=1"])
    run = acct.jobs[0].runs[0]
    assert run.limit_s is None
    assert acct.as_of == datetime(2025, 3, 1, 12, tzinfo=UTC)
    assert run.finished_at(acct.as_of) == acct.as_of


@pytest.mark.parametrize(("lines", "message"), [
    (["JobID|State|Submit|Start|End|AllocTRES"], r"line 1: the header lacks column\(s\) TimelimitRaw"),
    ([HEADER.replace("ReqTRES", "State")], r"line 1: column\(s\) State appear twice"),
    ([HEADER, f"1|COMPLETED|2025-03-01 10:00|{T0}|{T1}|60|gres/gpu=1|"], "line 2: Submit '2025-03-01 10:00'"),
    ([HEADER, f"1|COMPLETED|2025-02-30T10:00:00|{T0}|{T1}|60|gres/gpu=1|"], "line 2: Submit .* not a valid date"),
    ([HEADER, "", f"1|COMPLETED|{T0}|{T0}|{T1}|60|gres/gpu=two|"], "line 3: AllocTRES entry 'gres/gpu=two'"),
    ([HEADER, f"1|COMPLETED|{T0}|{T0}|{T1}|60|gres/gpu:a100:2|"], "line 2: AllocTRES entry 'gres/gpu:a100:2' is not"),
    ([HEADER, f"1|COMPLETED|{T0}|{T0}|{T1}|60|gres/gpus=2|"], "line 2: AllocTRES .* unknown GPU TRES form"),
    ([HEADER, f"1|COMPLETED|{T0}|{T0}|{T1}|60|gres/gpu=1"], "line 2: 7 fields, the header has 8"),
    ([HEADER, f"1|FINISHED|{T0}|{T0}|{T1}|60|gres/gpu=1|"], "line 2: State 'FINISHED' is not a Slurm job state"),
    ([HEADER, f"1x|COMPLETED|{T0}|{T0}|{T1}|60|gres/gpu=1|"], "line 2: JobID '1x' is not a Slurm job id"),
    ([HEADER, f"1.batch|COMPLETED|{T0}|{T0}|{T1}||gres/gpu=1|"], "line 2: step 1.batch comes before"),
    ([HEADER, f"1|COMPLETED|{T0}|{T1}|{T0}|60|gres/gpu=1|"], "line 2: End .* is before Start"),
    ([HEADER, f"1|COMPLETED|{T0}|{T0}|{T1}|an hour|gres/gpu=1|"], "line 2: TimelimitRaw 'an hour'"),
    ([HEADER, f"1|RUNNING|{T0}|Unknown|Unknown|60|gres/gpu=1|"], "line 2: a RUNNING job without a Start"),
    ([HEADER, f"1_[3-1]|PENDING|{T0}|Unknown|Unknown|60||gres/gpu=1"], "line 2: array range"),
    ([HEADER, f"1|COMPLETED|{T0}|{T0}|{T1}|60|gres/gpu=1|", f"1|COMPLETED|{T0}|{T0}|{T1}|60|gres/gpu=1|"],
     "line 3: job 1 is listed twice"),
    ([], "line 1: the file is empty"),
])
def test_bad_input_is_named_with_its_line(lines: list[str], message: str):
    with pytest.raises(SacctError, match=message):
        parse(lines)
