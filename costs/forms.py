"""The upload forms of the cost pages."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from costs.inputs import SEVERITIES, tunable
from costs.model import LABELS
from costs.sacct import COMMAND
from costs.trace import DEFAULT_ORIGIN

OPENB = "alibaba-openb-2023"


def openb_dir() -> Any:
    return settings.GPUSWEEP_SHARED_DATA_DIR / "traces" / OPENB


class DrainCostForm(forms.Form):
    sacct = forms.FileField(label="sacct output", help_text=f"record it with: {COMMAND}")
    windows = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 40}),
                              help_text="when each window opened, one per line (2025-03-01T08:00)")
    baseline_start = forms.CharField(required=False, help_text="an ordinary period; empty: the week before")
    baseline_end = forms.CharField(required=False)
    days = forms.IntegerField(initial=7, min_value=1, max_value=90, help_text="days measured before each window")
    tz = forms.CharField(initial="UTC", help_text="time zone of the file and of the times above")


class SimulateForm(forms.Form):
    fleet = forms.ChoiceField(help_text="a cluster of the inventory, a node file, or the shared Alibaba fleet")
    fleet_file = forms.FileField(required=False, label="Node file", help_text="a node file, as import_nodes reads it")
    mapping = forms.CharField(required=False, label="Node file mapping",
                              help_text="mapping of the node file (the Alibaba one is detected)")
    trace = forms.ChoiceField(label="Job trace", help_text="sacct -P output or a pod/task CSV")
    trace_file = forms.FileField(required=False, label="Trace file")
    advisory = forms.ChoiceField(required=False, help_text="a real advisory: its severity (and its release date "
                                 "when that falls inside the trace)")
    severity = forms.ChoiceField(choices=[(s, s) for s in SEVERITIES], initial="high",
                                 label="Severity (without an advisory)")
    release = forms.CharField(required=False, label="Advisory released at",
                              help_text="days after the trace's start, or a moment; empty: the middle of the trace")
    trace_start = forms.CharField(initial=DEFAULT_ORIGIN.isoformat(), label="Trace clock starts at",
                                  help_text="where a pod/task file's clock starts")
    sensitivity = forms.BooleanField(required=False, label="Sensitivity analysis",
                                     help_text="also vary parallelism, window cadence, checkpointable share and "
                                               "wait limit, one at a time (slower)")

    def __init__(self, *args: Any, clusters: list[str], advisories: list[tuple[str, str]], **kwargs: Any) -> None:
        # Labels are written as people read them ("Nodes patched at a time"), with no colon.
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        shared = (openb_dir() / "openb_node_list_gpu_node.csv").exists()
        fleets = [("file", "node file (upload)")] + [(f"cluster:{c}", f"cluster {c}") for c in clusters]
        traces = [("file", "trace file (upload)")]
        if shared:
            fleets.append((OPENB, "Alibaba openb-2023: 1,213 GPU nodes (shared data)"))
            traces.append((OPENB, "Alibaba openb-2023: 8,152 tasks (shared data)"))
        fleet_field = self.fields["fleet"]
        trace_field = self.fields["trace"]
        assert isinstance(fleet_field, forms.ChoiceField) and isinstance(trace_field, forms.ChoiceField)
        fleet_field.choices = fleets
        trace_field.choices = traces
        advisory_field = self.fields["advisory"]
        assert isinstance(advisory_field, forms.ChoiceField)
        advisory_field.choices = [("", "none: use the severity"), *advisories]
        for name, text, default in tunable():
            self.fields[f"p_{name}"] = forms.CharField(required=False, initial=default, help_text=text,
                                                       label=LABELS[name])

    def params(self) -> dict[str, str]:
        return {k[2:]: str(v) for k, v in self.cleaned_data.items() if k.startswith("p_")}
