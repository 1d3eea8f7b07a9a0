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


class RangeBasis(ChoiceSet):
    """How a range came about; every basis but `decoded` (and `mapped`) means "we could not tell"."""

    DECODED = "decoded"
    MAPPED = "mapped"
    UNDECODED = "undecoded"
    UNSUPPORTED_BRANCH = "unsupported_branch"
    CHOICES = [
        (DECODED, "Decoded from the bulletin"),
        (MAPPED, "Mapped by an admin from a row the parser could not read"),
        (UNDECODED, "The bulletin's row could not be decoded: any version of the product is presumed affected"),
        (UNSUPPORTED_BRANCH, "A driver branch the bulletin skips while naming older and newer ones"),
    ]
    PRESUMED = frozenset({UNDECODED, UNSUPPORTED_BRANCH})


class ReviewKind(ChoiceSet):
    UNPARSED_ROW = "unparsed_row"
    UNMAPPED_PRODUCT = "unmapped_product"
    UNKNOWN_PRODUCT = "unknown_product"
    UNSUPPORTED_BRANCH = "unsupported_branch"
    INDEX_ONLY = "index_only"
    CHOICES = [
        (UNPARSED_ROW, "A product row that does not decode, or reads wrong"),
        (UNMAPPED_PRODUCT, "A product no inventory component maps to"),
        (UNKNOWN_PRODUCT, "A CVE names a product id the product tree lacks"),
        (UNSUPPORTED_BRANCH, "Driver branches the bulletin skips"),
        (INDEX_ONLY, "Known only from NVIDIA's CVE index: no CSAF document to decode"),
    ]


class ReviewState(ChoiceSet):
    OPEN = "open"
    MAPPED = "mapped"
    DISMISSED = "dismissed"
    CHOICES = [(OPEN, "Needs review"), (MAPPED, "Mapped"), (DISMISSED, "Dismissed")]
    RESOLVED = frozenset({MAPPED, DISMISSED})


class VexJustification(ChoiceSet):
    """CSAF 2.0 flags[].label (section 3.2.3.5): why a product is known not affected."""

    COMPONENT_NOT_PRESENT = "component_not_present"
    VULNERABLE_CODE_NOT_PRESENT = "vulnerable_code_not_present"
    VULNERABLE_CODE_NOT_IN_EXECUTE_PATH = "vulnerable_code_not_in_execute_path"
    VULNERABLE_CODE_CANNOT_BE_CONTROLLED_BY_ADVERSARY = "vulnerable_code_cannot_be_controlled_by_adversary"
    INLINE_MITIGATIONS_ALREADY_EXIST = "inline_mitigations_already_exist"
    CHOICES = [
        (COMPONENT_NOT_PRESENT, "Component not present"),
        (VULNERABLE_CODE_NOT_PRESENT, "Vulnerable code not present"),
        (VULNERABLE_CODE_NOT_IN_EXECUTE_PATH, "Vulnerable code not in execute path"),
        (VULNERABLE_CODE_CANNOT_BE_CONTROLLED_BY_ADVERSARY, "Vulnerable code cannot be controlled by adversary"),
        (INLINE_MITIGATIONS_ALREADY_EXIST, "Inline mitigations already exist"),
    ]


class SourceKind(ChoiceSet):
    FILE = "file"
    FOLDER = "folder"
    URL = "url"
    FEED = "feed"
    GITHUB = "github"
    INDEX = "index"
    BUNDLE = "bundle"
    CHOICES = [
        (FILE, "File"),
        (FOLDER, "Folder"),
        (URL, "URL"),
        (FEED, "ROLIE/Atom/RSS feed"),
        (GITHUB, "NVIDIA GitHub repository"),
        (INDEX, "NVIDIA JSON index"),
        (BUNDLE, "OSV bundle (zip)"),
    ]


class ExposureState(ChoiceSet):
    OPEN = "open"
    PRESUMED = "presumed"
    REMEDIATED = "remediated"
    RISK_ACCEPTED = "risk_accepted"
    NOT_AFFECTED = "not_affected"
    CHOICES = [
        (OPEN, "Open"),
        (PRESUMED, "Presumed exposed (the bulletin does not tell)"),
        (REMEDIATED, "Remediated"),
        (RISK_ACCEPTED, "Risk accepted"),
        (NOT_AFFECTED, "Not affected (approver's justification)"),
    ]
    # Active exposures carry a deadline and count as exposed; `presumed` is shown and counted too.
    ACTIVE = frozenset({OPEN, PRESUMED, RISK_ACCEPTED})
    # States an inventory change can end (the version left the range).
    TRACKED = frozenset({OPEN, PRESUMED, RISK_ACCEPTED, NOT_AFFECTED})


class DeadlineBasis(ChoiceSet):
    PUBLICATION = "publication"
    FIRST_EXPOSURE = "first_exposure"
    CHOICES = [(PUBLICATION, "From the bulletin's publication"), (FIRST_EXPOSURE, "From first exposure")]


class EventKind(ChoiceSet):
    CREATED = "created"
    UPDATED = "updated"
    INTEGRITY_MISMATCH = "integrity_mismatch"
    REJECTED = "rejected"
    RISK_ACCEPTED = "risk_accepted"
    RISK_REVOKED = "risk_revoked"
    NOT_AFFECTED = "not_affected"
    REVIEW_MAPPED = "review_mapped"
    REVIEW_DISMISSED = "review_dismissed"
    PRESUMED_WITHDRAWN = "presumed_withdrawn"
    POLICY_CHANGED = "policy_changed"
    CHOICES = [
        (CREATED, "Advisory created"),
        (UPDATED, "Advisory updated to a newer revision"),
        (INTEGRITY_MISMATCH, "Published SHA-256 does not match"),
        (REJECTED, "Document rejected"),
        (RISK_ACCEPTED, "Risk accepted by an approver"),
        (RISK_REVOKED, "Risk acceptance revoked"),
        (NOT_AFFECTED, "Set not affected by an approver"),
        (REVIEW_MAPPED, "Review item mapped by an admin"),
        (REVIEW_DISMISSED, "Review item dismissed by an admin"),
        (PRESUMED_WITHDRAWN, "Presumed exposures withdrawn: the row is decoded now"),
        (POLICY_CHANGED, "Deadline policy changed by an admin: every deadline follows"),
    ]
