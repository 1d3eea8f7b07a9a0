from __future__ import annotations

from gpusweep.choices import ChoiceSet


class Severity(ChoiceSet):
    CRITICAL = "critical"
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"
    NONE = "none"
    CHOICES = [(CRITICAL, "Critical"), (HIGH, "High"), (MEDIUM, "Medium / Moderate"), (LOW, "Low"), (NONE, "None")]
    # Highest first: used to pick the worst of several CVEs.
    RANK = {CRITICAL: 4, HIGH: 3, MEDIUM: 2, LOW: 1, NONE: 0}

    @classmethod
    def normalize(cls, text: str | None) -> str:
        """'HIGH', 'Moderate', 'medium' -> our value; '' when absent or unknown."""
        value = (text or "").strip().lower()
        if value == "moderate":
            value = cls.MEDIUM
        return value if value in cls.RANK else ""

    @classmethod
    def worst(cls, values: list[str]) -> str:
        known = [v for v in values if v in cls.RANK]
        return max(known, key=lambda v: cls.RANK[v]) if known else ""


class Integrity(ChoiceSet):
    MATCH = "match"
    MISMATCH = "mismatch"
    ABSENT = "absent"
    CHOICES = [
        (MATCH, "SHA-256 matches the published one"),
        (MISMATCH, "SHA-256 differs from the published one"),
        (ABSENT, "No published SHA-256"),
    ]


class ComponentKind(ChoiceSet):
    """Component names as inventory.versions knows them, so ranges join NodeComponent.component."""

    DRIVER = "driver"
    CONTAINER_TOOLKIT = "container_toolkit"
    GPU_OPERATOR = "gpu_operator"
    DCGM = "dcgm"
    TRITON = "triton"
    FIRMWARE = "firmware"
    OTHER = "other"
    CHOICES = [
        (DRIVER, "GPU driver"),
        (CONTAINER_TOOLKIT, "NVIDIA Container Toolkit"),
        (GPU_OPERATOR, "NVIDIA GPU Operator"),
        (DCGM, "DCGM"),
        (TRITON, "Triton Inference Server"),
        (FIRMWARE, "Firmware"),
        (OTHER, "Other"),
    ]


class SourceKind(ChoiceSet):
    FILE = "file"
    FOLDER = "folder"
    URL = "url"
    FEED = "feed"
    GITHUB = "github"
    INDEX = "index"
    CHOICES = [
        (FILE, "File"),
        (FOLDER, "Folder"),
        (URL, "URL"),
        (FEED, "ROLIE/Atom/RSS feed"),
        (GITHUB, "NVIDIA GitHub repository"),
        (INDEX, "NVIDIA JSON index"),
    ]


class ExposureState(ChoiceSet):
    OPEN = "open"
    REMEDIATED = "remediated"
    RISK_ACCEPTED = "risk_accepted"
    CHOICES = [(OPEN, "Open"), (REMEDIATED, "Remediated"), (RISK_ACCEPTED, "Risk accepted")]
    ACTIVE = frozenset({OPEN, RISK_ACCEPTED})


class DeadlineBasis(ChoiceSet):
    PUBLICATION = "publication"
    FIRST_EXPOSURE = "first_exposure"
    CHOICES = [(PUBLICATION, "From the bulletin's publication"), (FIRST_EXPOSURE, "From first exposure")]


class EventKind(ChoiceSet):
    CREATED = "created"
    UPDATED = "updated"
    INTEGRITY_MISMATCH = "integrity_mismatch"
    REJECTED = "rejected"
    CHOICES = [
        (CREATED, "Advisory created"),
        (UPDATED, "Advisory updated to a newer revision"),
        (INTEGRITY_MISMATCH, "Published SHA-256 does not match"),
        (REJECTED, "Document rejected"),
    ]
