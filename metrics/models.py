"""Running totals folded from the campaign evidence log, so a scrape never reads the whole log.

The evidence log (campaigns.EvidenceEvent) is append-only: each scrape folds the events it has not
seen yet into `EvidenceTotal` rows (metrics.rollup) and moves `EvidenceCursor` on, in one
transaction. Counters and histograms so survive restarts and agree across every web process.
"""

from __future__ import annotations

from django.db import models


class EvidenceCursor(models.Model):
    """How far the evidence log has been folded (one row, pk 1).

    ``gaps`` lists ids below ``last_id`` that were not there when the fold passed them, as
    ``[id, unix time first missed]``: on PostgreSQL a transaction that began earlier may commit its
    lower id later. Each fold looks for them again, and forgets them after ``rollup.GAP_TTL_S``
    (a rolled-back insert leaves a hole that never fills).
    """

    last_id = models.BigIntegerField(default=0)
    gaps = models.JSONField(default=list, blank=True)
    folded_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"evidence folded to {self.last_id}"


class EvidenceTotal(models.Model):
    """One series of a counter or histogram: its labels, count, sum and bucket counts.

    ``buckets`` maps a bucket's upper bound (``repr`` of the float) to the observations that fell in
    it and in no lower one; the exposition makes them cumulative for the bounds in code, so bounds
    can be added later without a migration.
    """

    family = models.CharField(max_length=100)
    labels = models.CharField(max_length=500, help_text="canonical JSON of the series' labels")
    count = models.BigIntegerField(default=0)
    sum = models.FloatField(default=0)
    buckets = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["family", "labels"]
        constraints = [models.UniqueConstraint(fields=["family", "labels"], name="evidence_total_series_unique")]

    def __str__(self) -> str:
        return f"{self.family}{self.labels}"
