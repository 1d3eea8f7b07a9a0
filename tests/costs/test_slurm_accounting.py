"""drain_cost on sacct output recorded from a real Slurm cluster around a real maintenance reservation.

Real parts: munged, slurmctld, two slurmd and slurmdbd storing into the machine's MariaDB
(tests/slurm_cluster.py with accounting=True); real batch jobs of different lengths and time
limits; a real `scontrol create reservation ... flags=maint`. About 90 s (the reservation opens
75 s after the first job starts).
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest

from conftest import need
from costs.drain import drain_cost
from costs.sacct import FIELDS, parse
from tests.helpers import wait_for
from tests.slurm_cluster import SlurmCluster, can_run_slurm

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


class GpuAccountingCluster(SlurmCluster):
    """A site that accounts GPUs: without AccountingStorageTRES=gres/gpu, sacct's TRES carry no GPUs."""

    def _accounting_lines(self) -> list[str]:
        return [*super()._accounting_lines(), "AccountingStorageTRES=gres/gpu"]


def _time(text: str) -> datetime | None:
    return None if text in ("Unknown", "None", "") else datetime.fromisoformat(text).replace(tzinfo=UTC)


def _gpus(tres: str) -> int:
    return sum(int(item.split("=")[1]) for item in tres.split(",") if item.startswith("gres/gpu="))


def hand_count(text: str, opens: datetime) -> dict[str, object]:
    """The same records counted directly, line by line, without costs.sacct."""
    rows = [dict(zip(FIELDS, line.split("|"), strict=True)) for line in text.splitlines()[1:] if line.strip()]
    held = [r for r in rows if _time(r["Eligible"]) < opens and ((_time(r["Start"]) or opens) >= opens)]  # type: ignore[operator]
    running, day_hours = [], 0.0
    for r in rows:
        start = _time(r["Start"])
        if start is None:
            continue
        end = _time(r["End"]) or start + timedelta(seconds=int(r["ElapsedRaw"]))
        gpus = _gpus(r["AllocTRES"])
        day_hours += gpus * max(0.0, (min(end, opens) - max(start, opens - timedelta(days=1))).total_seconds()) / 3600
        if start < opens < end:
            running.append((r["JobID"], gpus * (opens - start).total_seconds() / 3600))
    return {
        "held": sorted(r["JobID"] for r in held),
        "held_requested_gpu_hours": round(sum(_gpus(r["ReqTRES"]) * int(r["TimelimitRaw"]) / 60 for r in held), 4),
        "running": sorted(job for job, _h in running),
        "recompute_gpu_hours_ceiling": round(sum(h for _j, h in running), 4),
        "day_-1_gpu_hours": round(day_hours, 4),
        "day_-1_submissions": len(rows),
    }


def test_drain_cost_of_a_real_reservation_gives_the_hand_count(tmp_path):
    ok, reason = can_run_slurm(accounting=True)
    need(ok, reason)
    began = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    with GpuAccountingCluster(tmp_path / "slurm", nodes=["gpu01", "gpu02"], accounting=True) as cluster:
        long = cluster.sbatch("sleep 600", nodelist="gpu01", gpus=2, name="long", time_limit="00:20:00")
        assert cluster.wait_running([long]), cluster.logs()
        opens = (datetime.now(UTC) + timedelta(seconds=75)).replace(microsecond=0)
        cluster.run("scontrol", "create", "reservation", "reservationname=maint", "users=root", "nodes=ALL",
                    f"starttime={opens.astimezone():%Y-%m-%dT%H:%M:%S}", "duration=30", "flags=maint,ignore_jobs")
        short = cluster.sbatch("sleep 2", gpus=1, name="short", time_limit="00:01:00")  # ends before the window
        crosses = cluster.sbatch("sleep 2", gpus=2, name="crosses", time_limit="00:10:00")
        crosses_too = cluster.sbatch("sleep 2", gpus=1, name="crosses-too", time_limit="00:05:00")
        assert cluster.wait_ended(short, timeout=60)
        time.sleep(max(0.0, (opens - datetime.now(UTC)).total_seconds()) + 5)

        def record() -> str:
            result = subprocess.run(
                ["sacct", "--allusers", "--duplicates", "--parsable2", "--allocations",
                 "--starttime", f"{began:%Y-%m-%dT%H:%M:%S}", "--endtime", "now", f"--format={','.join(FIELDS)}"],
                env={**cluster.env, "TZ": "UTC"}, capture_output=True, text=True, timeout=30, check=True)
            return result.stdout

        text = wait_for(lambda: (out := record()).count("\n") >= 5 and out, 30)
        assert text, "slurmdbd did not record the four jobs"

    print("\nsacct output:\n" + text)
    hand = hand_count(text, opens)
    [cost] = drain_cost(parse(text.splitlines()), [opens], (opens - timedelta(hours=3), opens - timedelta(hours=2)),
                        lookback_days=1)
    got = {
        "held": sorted(j.job_id for j in cost.held), "held_requested_gpu_hours": round(cost.held_gpu_hours, 4),
        "running": sorted(j.job_id for j in cost.running),
        "recompute_gpu_hours_ceiling": round(cost.recompute_ceiling_gpu_hours, 4),
        "day_-1_gpu_hours": round(cost.days[-1].gpu_hours, 4), "day_-1_submissions": cost.days[-1].submissions,
    }
    print("hand count:", json.dumps(hand))
    print("drain_cost:", json.dumps(got))
    assert got == hand
    # What the jobs were made to do: the reservation held the two whose limits cross it, and the one
    # started before it was set is the work computed again.
    assert hand["held"] == sorted([crosses, crosses_too]) and hand["running"] == [long]
    assert hand["held_requested_gpu_hours"] == round(2 * 10 / 60 + 1 * 5 / 60, 4)
    # The drain is the net difference (#32): the baseline hour before any job is empty, so it is
    # minus the GPU-hours of the day before the window, which ran these jobs.
    assert round(cost.drain_gpu_hours, 4) == round(-hand["day_-1_gpu_hours"], 4)
