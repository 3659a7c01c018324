#!/usr/bin/env python3
"""Static checks of deploy/grafana/allocd-dashboard.json: valid JSON that
Grafana imports (unique panel ids, panels inside the 24-column grid, every
query on the $datasource variable), per-node and per-job template variables
that the queries use, and the views the issue asks for."""
import json
import re
import sys

import deploylib as d


def main():
    dash = json.loads(d.DASHBOARD.read_text())
    for key in ("title", "uid", "panels", "templating", "schemaVersion"):
        if key not in dash:
            d.fail(f"dashboard has no {key!r}")
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    for name in ("datasource", "node", "job"):
        if name not in variables:
            d.fail(f"no ${name} template variable")
    if variables["datasource"].get("type") != "datasource":
        d.fail("$datasource is not a datasource variable")

    ids, panels = set(), []

    def walk(items):
        for panel in items:
            panels.append(panel)
            walk(panel.get("panels", []))

    walk(dash["panels"])
    for panel in panels:
        if panel["id"] in ids:
            d.fail(f"duplicate panel id {panel['id']}")
        ids.add(panel["id"])
        pos = panel["gridPos"]
        if pos["x"] < 0 or pos["x"] + pos["w"] > 24:
            d.fail(f"panel {panel['title']!r} leaves the 24-column grid")
        if panel["type"] == "row":
            continue
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            d.fail(f"panel {panel['title']!r} is not on ${{datasource}}")
        if not panel.get("targets") or not all(t.get("expr") for t in panel["targets"]):
            d.fail(f"panel {panel['title']!r} has a target without a query")
        for target in panel["targets"]:
            if target.get("datasource", {}).get("uid") != "${datasource}":
                d.fail(f"panel {panel['title']!r}: a target is not on ${{datasource}}")

    exprs = d.dashboard_exprs()
    text = "\n".join(e for _, e in exprs)
    if '$node' not in text or '$job' not in text:
        d.fail("queries do not use $node and $job")

    def panel_with(pattern):
        return [p for p in panels if p["type"] != "row" and
                re.search(pattern, " ".join(t["expr"] for t in p["targets"]))]

    views = {
        "reserved vs allocated": r"allocd_reserved_bytes.*allocd_allocated_bytes",
        "fragmentation ratio": r"allocd_fragmentation_ratio",
        "OOMs and retries": r"allocd_ooms_total.*allocd_alloc_retries_total",
        "pool usage": r"allocd_pool_bytes",
        "RPC latency": r"histogram_quantile\(.*allocd_rpc_duration_seconds_bucket",
        "config versions": r"allocd_config_version",
        "autotuner decisions": r"allocd_autotune_decisions_total",
        "autotuner savings": r"allocd_autotune_predicted_saving_bytes.*"
                             r"allocd_autotune_realized_saving_bytes",
    }
    for view, pattern in views.items():
        if not panel_with(pattern):
            d.fail(f"no panel shows {view} ({pattern})")
    annotations = [a for a in dash["annotations"]["list"]
                   if "allocd_config_version" in a.get("expr", "")]
    if not annotations:
        d.fail("config version changes are not annotations")
    # Autotuning's savings: allocd tune's prediction sent with the push, set
    # against the peak the job then reaches, in one panel that says so.
    savings = [p for p in panels
               if {"allocd_config_predicted_peak_reserved_bytes", "allocd_peak_reserved_bytes"}
               <= {m for t in p.get("targets", []) for m in d.metric_names(t.get("expr", ""))}]
    if not savings or "savings" not in savings[0].get("title", "").lower() \
            or "predicted" not in savings[0].get("description", "").lower():
        d.fail("no panel sets the predicted peak reserved against the realised one, "
               "titled as savings and saying what it shows")
    d.log(f"dashboard {dash['uid']!r}: {len(panels)} panels, {len(exprs)} queries, "
          f"variables {', '.join('$' + v for v in variables)}; views: "
          f"{', '.join(views)}, savings, config-version annotations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
