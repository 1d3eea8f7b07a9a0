"""The cost pages: the drain cost of past windows from an uploaded sacct file, and the simulator.

Both only read what is handed in (and the inventory, for a cluster's fleet): any role may use
them. A bad file is named with its line and nothing is shown but the error.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.core.files.uploadedfile import UploadedFile
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from costs import charts, fleet, report
from costs.drain import DrainError, WindowCost, drain_cost
from costs.forms import OPENB, DrainCostForm, SimulateForm, openb_dir
from costs.inputs import InputError, is_sacct, parse_moment, prepare, read_accounting, zone_of
from costs.model import ModelError
from costs.sacct import COMMAND, SacctError
from costs.sensitivity import STRATEGIES, Point, sensitivity, table
from costs.simulate import STRATEGY_NAMES, Result, simulate
from costs.trace import TraceError
from costs.tracestats import trace_stats
from gpusweep.roles import user_roles


class Refused(ValueError):
    pass


def _need_role(request: HttpRequest) -> None:
    if not user_roles(request.user):
        raise PermissionDenied("a role (viewer or more) is needed to see costs")


def _text(upload: UploadedFile | None, what: str) -> str:
    if upload is None:
        raise Refused(f"choose a {what} to upload")
    limit = settings.GPUSWEEP_IMPORT_MAX_BYTES
    if (upload.size or 0) > limit:
        raise Refused(f"{upload.name} is over the upload limit of {limit // 1024 // 1024} MiB (GPUSWEEP_IMPORT_MAX_MB)")
    try:
        return upload.read().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise Refused(f"{upload.name}: not UTF-8 text (byte {exc.start})") from None


def tools_page(request: HttpRequest) -> HttpResponse:
    """/costs/: the two tools, so the bare address lands somewhere."""
    _need_role(request)
    return render(request, "costs/tools.html")


def _drain_charts(cost: WindowCost, number: int) -> list[dict[str, Any]]:
    """GPU-hours and submissions per day (one unit each), each with its baseline as a line."""
    days = [f"{d.offset} ({d.start:%m-%d})" for d in cost.days]
    when = f"{cost.window:%Y-%m-%d %H:%M} UTC"
    return [
        charts.bars(f"drain-chart-{number}", f"GPU-hours per day before the window of {when}", "GPU-hours", days,
                    [("GPU-hours allocated", [round(d.gpu_hours, 2) for d in cost.days])],
                    xlabel="day before the window",
                    baseline=("baseline day", round(cost.baseline_gpu_hours_per_day, 2))).as_dict(),
        charts.bars(f"drain-submissions-{number}", f"Submissions per day before the window of {when}", "submissions",
                    days, [("submissions", [float(d.submissions) for d in cost.days])], xlabel="day before the window",
                    baseline=("baseline day", round(cost.baseline_submissions_per_day, 2))).as_dict(),
    ]


def drain_cost_page(request: HttpRequest) -> HttpResponse:
    _need_role(request)
    form = DrainCostForm(request.POST or None, request.FILES or None)
    context: dict[str, Any] = {"form": form, "command": COMMAND}
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            zone = zone_of(data["tz"])
            windows = [parse_moment(line, zone, "window") for line in data["windows"].splitlines() if line.strip()]
            baseline = None
            if data["baseline_start"] or data["baseline_end"]:
                baseline = (parse_moment(data["baseline_start"], zone, "baseline start"),
                            parse_moment(data["baseline_end"], zone, "baseline end"))
            upload = request.FILES.get("sacct")
            text = _text(upload, "sacct file")
            try:
                acct = read_accounting(text, zone)
            except SacctError as exc:
                raise Refused(f"{upload.name if upload else 'sacct'}: {exc}") from None
            costs = drain_cost(acct, windows, baseline, data["days"])
        except (Refused, InputError, DrainError) as exc:
            context["error"] = str(exc)
        else:
            context["costs"] = costs
            context["charts"] = [chart for i, c in enumerate(costs, start=1) for chart in _drain_charts(c, i)]
            context["jobs"] = len(acct.jobs)
    return render(request, "costs/drain_cost.html", context)


def _sim_charts(result: Result) -> list[dict[str, Any]]:
    """Share patched over time; exposure (node-days) and GPU-hours lost apart, one unit per chart."""
    runs = [f"{r.strategy} {r.cadence}" for r in result.rows]
    curves = [(f"{r.label}, {r.cadence}", list(curve)) for r, curve in zip(result.rows, result.curves, strict=True)]
    out = [
        charts.steps("sim-patched", "Share of the fleet patched", "share of nodes patched", "days since release",
                     curves, ytop=1.0),
        charts.bars("sim-exposure", "Exposure", "node-days", runs,
                    [("exposure node-days", [round(r.exposure_node_days, 1) for r in result.rows])]),
        charts.bars("sim-gpu-hours", "GPU-hours lost", "GPU-hours", runs,
                    [("idle GPU-hours", [round(r.idle_gpu_hours, 1) for r in result.rows]),
                     ("recomputed GPU-hours", [round(r.recomputed_gpu_hours, 1) for r in result.rows])]),
    ]
    if result.stats is not None:
        points = result.stats.utilization(result.gpus)
        out.append(charts.steps("sim-utilization", "GPUs busy in the trace file", "share of GPUs busy", "day",
                                [("GPUs busy", [(d, round(u, 4)) for d, u in points])]))
    return [c.as_dict() for c in out]


def _sensitivity_charts(points: list[Point]) -> list[dict[str, Any]]:
    out = []
    for axis in dict.fromkeys(p.axis for p in points):
        mine = [p for p in points if p.axis == axis]
        out.append(charts.bars(f"sens-{axis}", f"Exposure as {axis.replace('_', ' ')} varies", "node-days",
                               [p.value for p in mine],
                               [(STRATEGY_NAMES[s], [round(p.exposure[s], 1) for p in mine]) for s in STRATEGIES],
                               xlabel=axis.replace("_", " ")).as_dict())
    return out


def _fleet(choice: str, upload: UploadedFile | None, mapping: str) -> list[fleet.SimNode]:
    if choice.startswith("cluster:"):
        return fleet.from_cluster(choice.removeprefix("cluster:"))
    if choice == OPENB:
        return fleet.from_file(openb_dir() / "openb_node_list_gpu_node.csv")
    text = _text(upload, "node file")
    suffix = Path(upload.name or "nodes.csv").suffix if upload is not None else ".csv"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{Path(upload.name or 'nodes').stem if upload else 'nodes'}{suffix}"
        path.write_text(text, encoding="utf-8")
        return fleet.from_file(path, mapping or None)


def simulate_page(request: HttpRequest) -> HttpResponse:
    from advisories.models import Advisory
    from inventory.models import Cluster

    _need_role(request)
    advisories = [(a.publisher_id, f"{a} ({a.severity})") for a in
                  Advisory.objects.exclude(severity__in=["", "none"]).order_by("-initial_release_date")[:200]]
    form = SimulateForm(request.POST or None, request.FILES or None,
                        clusters=list(Cluster.objects.order_by("name").values_list("name", flat=True)),
                        advisories=advisories)
    context: dict[str, Any] = {"form": form}
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            zone = zone_of("UTC")
            nodes = _fleet(data["fleet"], request.FILES.get("fleet_file"), data["mapping"])
            if data["trace"] == OPENB:
                source = "openb_pod_list_default.csv"
                text = (openb_dir() / source).read_text(encoding="utf-8")
            else:
                upload = request.FILES.get("trace_file")
                text = _text(upload, "trace file")
                source = upload.name or "trace" if upload else "trace"
            try:
                tr, params, label = prepare(
                    text, form.params(), severity=data["severity"], advisory_id=data["advisory"],
                    release=data["release"], origin=parse_moment(data["trace_start"], zone, "trace start"),
                    zone=zone, source=source)
            except SacctError as exc:
                raise Refused(f"{source}: {exc}") from None
            result = simulate(nodes, tr, params)
            if not is_sacct(text):
                result.stats = trace_stats(text, (result.release,))
            points = sensitivity(nodes, tr, params) if data.get("sensitivity") else []
        except ModelError as exc:
            context["error"] = str(exc)
            name = str(exc).split("=", 1)[0].split(":", 1)[0].strip()
            if f"p_{name}" in form.fields:
                form.add_error(f"p_{name}", str(exc))  # shown beside the field, which keeps its value
        except (Refused, InputError, TraceError, fleet.FleetError) as exc:
            context["error"] = str(exc)
        else:
            facts = result.facts()
            context.update(result=result, facts=facts, advisory_label=label, unplaced=report.unplaced_text(facts),
                           charts=_sim_charts(result) + _sensitivity_charts(points),
                           stats=report.stats_lines(result), holds=report.holds_lines(result),
                           sensitivity=table(points) if points else "")
    return render(request, "costs/simulate.html", context)
