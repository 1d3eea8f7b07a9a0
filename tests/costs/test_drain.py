"""drain_cost on sacct text, against a count done by hand on the same records."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from costs.drain import DrainError, drain_cost
from costs.sacct import parse

HEADER = "JobID|JobIDRaw|JobName|Partition|State|Submit|Eligible|Start|End|ElapsedRaw|TimelimitRaw|ReqTRES|AllocTRES|NNodes|NodeList"  # noqa: E501
U = "Unknown"
# Window opens 2025-03-10T08:00Z; two days measured; baseline 2025-03-01T08:00 to 03-03T08:00.
RECORDS = [
    # baseline: 16 GPUs for the whole 48 h (submitted before the baseline)
    "100|100|train|gpu|COMPLETED|2025-03-01T07:00:00|2025-03-01T07:00:00|2025-03-01T08:00:00|2025-03-03T08:00:00|172800|4000|cpu=8,gres/gpu=16,node=2|cpu=8,gres/gpu=16,node=2|2|gpu[01-02]",
    "100.batch|100.batch|batch||COMPLETED|2025-03-01T08:00:00|2025-03-01T08:00:00|2025-03-01T08:00:00|2025-03-03T08:00:00|172800||cpu=4,gres/gpu=8|cpu=4,gres/gpu=8,mem=4G|1|gpu01",
    "100.extern|100.extern|extern||COMPLETED|2025-03-01T08:00:00|2025-03-01T08:00:00|2025-03-01T08:00:00|2025-03-03T08:00:00|172800||billing=8|billing=8|2|gpu[01-02]",
    # baseline: two array tasks, 2 GPUs x 12 h each
    "101_1|102|sweep|gpu|COMPLETED|2025-03-02T08:00:00|2025-03-02T08:00:00|2025-03-02T08:00:00|2025-03-02T20:00:00|43200|720|gres/gpu=2|gres/gpu=2|1|gpu03",
    "101_2|103|sweep|gpu|COMPLETED|2025-03-02T08:00:00|2025-03-02T08:00:00|2025-03-02T08:00:00|2025-03-02T20:00:00|43200|720|gres/gpu=2|gres/gpu=2|1|gpu04",
    # baseline: a heterogeneous job, 1 + 2 GPUs (the typed and untyped entries name the same 2) x 12 h
    "102+0|104|het|gpu|COMPLETED|2025-03-02T10:00:00|2025-03-02T10:00:00|2025-03-02T12:00:00|2025-03-03T00:00:00|43200|720|gres/gpu=1|cpu=1,gres/gpu=1|1|gpu05",
    "102+1|105|het|gpu|COMPLETED|2025-03-02T10:00:00|2025-03-02T10:00:00|2025-03-02T12:00:00|2025-03-03T00:00:00|43200|720|gres/gpu=2|cpu=1,gres/gpu:a100=2,gres/gpu=2|1|gpu06",
    # requeued (recorded with --duplicates): run 1 then run 2, still running when the window opened
    "103|106|long|gpu|REQUEUED|2025-03-08T09:00:00|2025-03-08T09:00:00|2025-03-08T09:00:00|2025-03-09T09:00:00|86400|2880|gres/gpu=2|gres/gpu=2|1|gpu01",
    "103|106|long|gpu|CANCELLED by 0|2025-03-09T09:00:00|2025-03-09T09:10:00|2025-03-09T09:10:00|2025-03-10T08:05:00|82500|2880|gres/gpu=2|gres/gpu=2|1|gpu02",  # noqa: E501
    # pending at the window: 4 GPUs x 24 h limit
    f"104|107|wait|gpu|PENDING|2025-03-09T10:00:00|2025-03-09T10:00:00|{U}|{U}|0|1440|cpu=4,gres/gpu=4||1|None assigned",  # noqa: E501
    # a pending array record of three tasks: 3 x 1 GPU x 2 h
    f"105_[1-3]|108|arr|gpu|PENDING|2025-03-09T12:00:00|2025-03-09T12:00:00|{U}|{U}|0|120|gres/gpu=1||1|None assigned",
    # cancelled while pending, before the window: not held
    "106|112|gone|gpu|CANCELLED by 1000|2025-03-09T13:00:00|2025-03-09T13:00:00|None|2025-03-09T15:00:00|0|60|gres/gpu=1||1|None assigned",  # noqa: E501
    # pending without a limit: held, no hours
    f"107|113|svc|gpu|PENDING|2025-03-09T14:00:00|2025-03-09T14:00:00|{U}|{U}|0|UNLIMITED|gres/gpu=2||1|None assigned",
    # eligible before the window, started after it: held, 1 GPU x 10 h
    "108|114|late|gpu|COMPLETED|2025-03-09T16:00:00|2025-03-09T16:00:00|2025-03-10T20:00:00|2025-03-10T22:00:00|7200|600|gres/gpu=1|gres/gpu=1|1|gpu03",
    # CPU only, running at the window: no GPU, left out
    f"109|115|cpu|cpu|RUNNING|2025-03-09T01:00:00|2025-03-09T01:00:00|2025-03-09T02:00:00|{U}|100000|UNLIMITED|cpu=4|cpu=4,mem=4G,node=1|1|cpu01",
    # 8 GPUs since before the days measured, still running
    f"110|116|big|gpu|RUNNING|2025-03-07T07:00:00|2025-03-07T07:00:00|2025-03-07T08:00:00|{U}|259200|10080|gres/gpu=8|cpu=8,gres/gpu=8|1|gpu07",
    "110.0|116.0|python||RUNNING|2025-03-07T08:00:00|2025-03-07T08:00:00|2025-03-07T08:00:00|Unknown|259200||gres/gpu=8|gres/gpu=8|1|gpu07",
    # typed GPU entry only: 1 GPU x 4 h on day -2
    "111|117|short|gpu|COMPLETED|2025-03-08T10:00:00|2025-03-08T10:00:00|2025-03-08T10:00:00|2025-03-08T14:00:00|14400|300|gres/gpu:v100=1|gres/gpu:v100=1|1|gpu08",
]
SACCT = "\n".join([HEADER, *RECORDS]) + "\n"
WINDOW = datetime(2025, 3, 10, 8, tzinfo=UTC)
BASELINE = (datetime(2025, 3, 1, 8, tzinfo=UTC), datetime(2025, 3, 3, 8, tzinfo=UTC))

# The hand count (GPU-hours; the window W = 03-10T08:00; day -2 = [03-08T08, 03-09T08), day -1 = [03-09T08, W)).
HAND = {
    # 16 x 48 (job 100) + 2 x 2 x 12 (101_1, 101_2) + 3 x 12 (102, its 2 GPUs counted once) = 852 over 2 days
    "baseline_gpu_hours_per_day": 852 / 2,
    # submitted in the baseline: 101_1, 101_2, 102 (job 100 was submitted before it)
    "baseline_submissions_per_day": 3 / 2,
    # day -2: 103 run 1 (2 x 23 h) + 110 (8 x 24 h) + 111 (1 x 4 h)
    "day_-2_gpu_hours": 2 * 23 + 8 * 24 + 1 * 4,
    # day -1: 103 run 1 (2 x 1 h) + run 2 (2 x 22 h 50 min) + 110 (8 x 24 h)
    "day_-1_gpu_hours": 2 * 1 + 2 * (22 + 50 / 60) + 8 * 24,
    "day_-2_submissions": 2,  # 103 (once, though requeued), 111
    "day_-1_submissions": 7,  # 104, three tasks of 105, 106, 107, 108 (not the CPU job 109)
    "held_jobs": 6,  # 104, 105 x 3, 107, 108
    "held_requested_gpu_hours": 4 * 24 + 3 * 1 * 2 + 1 * 10,  # 107 has no limit
    "held_without_limit": 1,
    "running_jobs": 2,  # 103 (its second run), 110
    "recompute_gpu_hours_ceiling": 2 * (22 + 50 / 60) + 8 * 72,
}
HAND["drain_gpu_hours_net"] = sum(
    HAND["baseline_gpu_hours_per_day"] - HAND[f"day_{d}_gpu_hours"] for d in (-2, -1))  # net, not clipped


def measured(cost) -> dict[str, float]:
    s = cost.summary()
    out = {k: s[k] for k in HAND if k in s}
    for day in cost.days:
        out[f"day_{day.offset}_gpu_hours"] = day.gpu_hours
        out[f"day_{day.offset}_submissions"] = day.submissions
    out["baseline_gpu_hours_per_day"] = cost.baseline_gpu_hours_per_day
    out["baseline_submissions_per_day"] = cost.baseline_submissions_per_day
    out["drain_gpu_hours_net"] = cost.drain_gpu_hours
    out["held_requested_gpu_hours"] = cost.held_gpu_hours
    out["recompute_gpu_hours_ceiling"] = cost.recompute_ceiling_gpu_hours
    return out


def test_it_gives_the_hand_count_of_the_same_records():
    [cost] = drain_cost(parse(SACCT.splitlines()), [WINDOW], BASELINE, lookback_days=2)
    got = measured(cost)
    print("\nhand count:", json.dumps(HAND, indent=1))
    print("drain_cost:", json.dumps(got, indent=1))
    assert got == pytest.approx(HAND)
    assert {j.job_id for j in cost.held} == {"104", "105_[1-3]", "107", "108"}
    assert {j.job_id for j in cost.running} == {"103", "110"}


def test_the_default_baseline_is_the_week_before_the_days_measured():
    [cost] = drain_cost(parse(SACCT.splitlines()), [WINDOW], lookback_days=2)
    assert (cost.baseline_start, cost.baseline_end) == (datetime(2025, 3, 1, 8, tzinfo=UTC),
                                                         datetime(2025, 3, 8, 8, tzinfo=UTC))
    # In that week: job 100's 768 GPU-hours, 48 of 101, 36 of 102, 110's first day (8 x 24) and 103 none.
    assert cost.baseline_gpu_hours_per_day == pytest.approx((768 + 48 + 36 + 8 * 24) / 7)
    # The records cover the baseline and the window. (Their ids are not in submission order, 110 and
    # 111 being submitted before 103 to 108: real sacct cannot show that without a requeue, hence
    # the -D warning, which test_plain_sacct_without_duplicates_is_warned_about checks.)
    assert [n for n in cost.notes if "without -D" not in n] == []


def test_each_window_is_measured_on_its_own():
    earlier = datetime(2025, 3, 9, 12, tzinfo=UTC)
    costs = drain_cost(parse(SACCT.splitlines()), [WINDOW, earlier], BASELINE, lookback_days=1)
    assert [c.window for c in costs] == [earlier, WINDOW]
    # At 03-09T12:00 only job 104 was pending (since 10:00); 103's second run, 109 (no GPU) and 110 ran.
    assert [j.job_id for j in costs[0].held] == ["104"]
    assert {j.job_id for j in costs[0].running} == {"103", "110"}


def test_a_baseline_that_ends_before_it_starts_is_refused():
    with pytest.raises(DrainError, match="end must come after the start"):
        drain_cost(parse(SACCT.splitlines()), [WINDOW], (BASELINE[1], BASELINE[0]))


def test_plain_sacct_without_duplicates_is_warned_about():
    """Without -D a requeued job (200) shows once, its Submit reset to the requeue, after 201's."""
    plain = "\n".join([HEADER,
        "200|200|long|gpu|RUNNING|2025-03-09T09:00:00|2025-03-09T09:10:00|2025-03-09T09:10:00|Unknown|80000|2880|gres/gpu=2|gres/gpu=2|1|gpu02",
        "201|201|short|gpu|COMPLETED|2025-03-08T10:00:00|2025-03-08T10:00:00|2025-03-08T10:00:00|2025-03-08T14:00:00|14400|300|gres/gpu=1|gres/gpu=1|1|gpu08",
    ]) + "\n"
    [cost] = drain_cost(parse(plain.splitlines()), [WINDOW], BASELINE, lookback_days=2)
    assert any("without -D" in n and "200" in n for n in cost.notes)
    # With -D the same job has its first run too (submitted before 201): no warning.
    duplicated = plain.replace("200|200|long|gpu|RUNNING", "200|200|long|gpu|REQUEUED|2025-03-08T09:00:00|"
                               "2025-03-08T09:00:00|2025-03-08T09:00:00|2025-03-09T09:00:00|86400|2880|gres/gpu=2|"
                               "gres/gpu=2|1|gpu01\n200|200|long|gpu|RUNNING", 1)
    [cost] = drain_cost(parse(duplicated.splitlines()), [WINDOW], BASELINE, lookback_days=2)
    assert not any("without -D" in n for n in cost.notes)


def test_the_drain_is_the_net_difference_not_clipped_at_zero():
    """A day above the baseline counts against a day below it: noise nets out. Against the default
    baseline (the week before, mostly empty here) both days are above it."""
    [cost] = drain_cost(parse(SACCT.splitlines()), [WINDOW], None, lookback_days=2)
    base = cost.baseline_gpu_hours_per_day
    assert cost.drain_gpu_hours == pytest.approx(sum(base - d.gpu_hours for d in cost.days))
    assert cost.days_above == [d.offset for d in cost.days if d.gpu_hours > base] == [-2, -1]
    assert cost.drain_gpu_hours < 0  # both days were busier than the baseline: clipped, this read 0
