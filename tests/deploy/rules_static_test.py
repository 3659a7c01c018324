#!/usr/bin/env python3
"""Static checks of the alerts (no tools needed): every alert has a severity,
a summary, a description and a runbook_url whose anchor is a heading of
docs/runbooks.md; every alert has promtool unit tests where it fires and where it must
not; the monitoring overlay's PrometheusRule is what gen-prometheusrule makes
of the rules file."""
import re
import subprocess
import sys

import deploylib as d


def github_anchor(heading):
    slug = heading.strip().lower()
    slug = re.sub(r"[^\w\- ]", "", slug)
    return slug.replace(" ", "-")


def rule_blocks(text):
    """{alert name: its text} from the rules file."""
    parts = re.split(r"^\s*- alert:\s*", text, flags=re.M)[1:]
    return {part.split()[0]: part for part in parts}


def main():
    text = d.RULES.read_text()
    alerts = d.alert_names()
    if len(alerts) < 6:
        d.fail(f"expected at least 6 alerts, found {alerts}")
    readme = (d.SOURCE_DIR / "docs" / "runbooks.md").read_text()
    anchors = {github_anchor(h) for h in re.findall(r"^#+\s+(.+)$", readme, re.M)}

    for name, block in rule_blocks(text).items():
        for key in ("severity:", "summary:", "description:", "runbook_url:"):
            if key not in block:
                d.fail(f"{name}: no {key[:-1]}")
        url = re.search(r"runbook_url:\s*(\S+)", block).group(1)
        anchor = url.split("#", 1)[1] if "#" in url else ""
        if "docs/runbooks.md#" not in url or anchor not in anchors:
            d.fail(f"{name}: runbook_url {url} does not point at a heading of "
                   f"docs/runbooks.md (#{anchor} not among its anchors)")

    # Unit tests: for every alert, an eval where it fires and one where not.
    firing, quiet = set(), set()
    current = None
    for line in d.RULES_TEST.read_text().splitlines():
        m = re.match(r"^\s*alertname:\s*(\S+)", line)
        if m:
            current = m.group(1)
        m = re.match(r"^\s*exp_alerts:\s*(.*)$", line)
        if m and current:
            (quiet if m.group(1).strip() == "[]" else firing).add(current)
    for name in alerts:
        if name not in firing:
            d.fail(f"{name}: no unit test where it fires ({d.RULES_TEST.name})")
        if name not in quiet:
            d.fail(f"{name}: no unit test where it stays quiet ({d.RULES_TEST.name})")
    unknown = (firing | quiet) - set(alerts)
    if unknown:
        d.fail(f"unit tests name alerts that do not exist: {sorted(unknown)}")

    gen = d.DEPLOY / "prometheus" / "gen-prometheusrule"
    proc = subprocess.run([sys.executable, str(gen), "--check"],
                          capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        d.fail(proc.stdout + proc.stderr)

    d.log(f"{len(alerts)} alerts ({', '.join(alerts)}): severity, summary, description, "
          f"runbook_url -> docs/runbooks.md anchor; each fires and stays quiet in unit tests; "
          f"PrometheusRule in sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
