"""The Slurm executor's pure parts: the record it keeps in a job's admin comment, and reading
`scontrol show reservation -o` (Slurm 22.05 prints no JSON for reservations)."""

from __future__ import annotations

import pytest

from executors.base import PermanentExecutorError
from executors.slurm import MARK, job_of, read_record, write_record
from inventory.sources.slurm import parse_key_values

LINE = ("ReservationName=gpusweep-c7-s3 StartTime=2026-12-02T01:00:00 EndTime=2026-12-02T03:00:00 "
        "Duration=02:00:00 Nodes=gpu[01-02] NodeCnt=2 CoreCnt=8 Features=(null) PartitionName=(null) "
        "Flags=MAINT,IGNORE_JOBS,SPEC_NODES TRES=cpu=8 Users=root Groups=(null) Accounts=(null) "
        "Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)")


def test_a_reservation_line_reads_as_its_fields() -> None:
    fields = parse_key_values(LINE)
    assert fields["ReservationName"] == "gpusweep-c7-s3" and fields["Nodes"] == "gpu[01-02]"
    assert fields["Flags"] == "MAINT,IGNORE_JOBS,SPEC_NODES" and fields["State"] == "ACTIVE"
    assert fields["TRES"] == "cpu=8"


def test_the_admin_comment_record_survives_scontrol_and_ignores_anyone_elses() -> None:
    record = {"ck": "ck-1", "ck_op": "gs-1-2-ck", "requires": {"must": {"kernel": "6.1 0"}}}
    text = write_record(record)
    assert text.startswith(MARK) and " " not in text and '"' not in text  # one scontrol argument, unquoted
    assert read_record({"admin_comment": text}) == record
    assert read_record({"admin_comment": "site: billing code 42"}) == {}
    assert read_record({"admin_comment": MARK + "not base64 json"}) == {}


def test_a_workload_id_names_a_job() -> None:
    assert job_of("slurm-42") == "42" and job_of("42") == "42"
    with pytest.raises(PermanentExecutorError):
        job_of("ml/trainer")
