#!/usr/bin/env python3
"""`kubectl kustomize` renders deploy/k8s/base and every overlay, each with
the objects it promises; the PrometheusRule that the monitoring overlay
renders passes the same promtool checks and unit tests as the rules file.
Skips when kubectl is not installed."""
import re
import shutil
import subprocess
import sys

import deploylib as d

EXPECTED = {
    "base": {"Namespace", "ServiceAccount", "ConfigMap", "Service", "DaemonSet"},
    "overlays/sidecar-example": {"Namespace", "ServiceAccount", "ConfigMap", "Job"},
    "overlays/monitoring": {"Namespace", "ServiceAccount", "ConfigMap", "Service",
                            "DaemonSet", "ServiceMonitor", "PrometheusRule",
                            "NetworkPolicy"},
}
ABSENT = {"overlays/sidecar-example": {"DaemonSet", "Service"}}


def documents(text):
    return [doc for doc in re.split(r"^---\s*$", text, flags=re.M) if doc.strip()]


def kind_of(doc):
    m = re.search(r"^kind:\s*(\S+)", doc, re.M)
    return m.group(1) if m else None


def check_daemon_pod(doc, where):
    for needle in ("--config=/etc/allocd/config.json", "mountPath: /etc/allocd",
                   "name: allocd-config", "path: /run/allocd", "- health",
                   "livenessProbe:", "readinessProbe:", "nvidia.com/gpu",
                   "runAsNonRoot: true", "containerPort: 9464"):
        if needle not in doc:
            d.fail(f"{where}: the DaemonSet lacks {needle!r}")


def main():
    kubectl = d.require_tool("kubectl", "kubectl (v1.32+, with kustomize built in)")
    root = d.DEPLOY / "k8s"
    dirs = ["base"] + sorted(f"overlays/{p.name}" for p in (root / "overlays").iterdir()
                             if (p / "kustomization.yaml").exists())
    missing = set(EXPECTED) - set(dirs)
    if missing:
        d.fail(f"missing kustomizations: {sorted(missing)}")
    rendered = {}
    for rel in dirs:
        proc = subprocess.run([kubectl, "kustomize", str(root / rel)],
                              capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            d.fail(f"kubectl kustomize {rel} failed:\n{proc.stderr}")
        docs = documents(proc.stdout)
        kinds = [kind_of(doc) for doc in docs]
        d.log(f"rendered {rel}: {len(docs)} objects ({', '.join(kinds)})")
        want = EXPECTED.get(rel, set())
        if not want <= set(kinds):
            d.fail(f"{rel}: expected {sorted(want - set(kinds))} in the output")
        if ABSENT.get(rel, set()) & set(kinds):
            d.fail(f"{rel}: {sorted(ABSENT[rel] & set(kinds))} should be left out")
        for doc in docs:
            if kind_of(doc) == "DaemonSet":
                check_daemon_pod(doc, rel)
            if kind_of(doc) == "Job" and "restartPolicy: Always" not in doc:
                d.fail(f"{rel}: the Job's allocd is not a native sidecar")
            if kind_of(doc) == "ConfigMap" and '"uid_quotas"' not in doc:
                d.fail(f"{rel}: the ConfigMap lacks config.json")
            if kind_of(doc) not in ("Namespace",) and not re.search(
                    r"^  namespace:\s*\S+", doc, re.M):
                d.fail(f"{rel}: {kind_of(doc)} has no namespace")
        rendered[rel] = docs

    # The PrometheusRule as the operator would receive it, through promtool.
    promtool = shutil.which("promtool")
    if promtool is None:
        d.log("note: promtool not installed; the rendered PrometheusRule is not run "
              "through promtool here")
        return 0
    rule = next(doc for doc in rendered["overlays/monitoring"]
                if kind_of(doc) == "PrometheusRule")
    spec = rule.split("\nspec:\n", 1)[1]
    groups = "\n".join(line[2:] for line in spec.splitlines()) + "\n"
    tmp = d.temp_dir("allocd-kust-")
    try:
        (tmp / "allocd-rules.yaml").write_text(groups)
        shutil.copy(d.RULES_TEST, tmp / "allocd-rules.test.yaml")
        for argv in ([promtool, "check", "rules", "allocd-rules.yaml"],
                     [promtool, "test", "rules", "allocd-rules.test.yaml"]):
            proc = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                d.fail(f"rendered PrometheusRule: {' '.join(argv[1:])} failed:\n"
                       f"{proc.stdout}{proc.stderr}")
        d.log("rendered PrometheusRule: promtool check rules and test rules pass")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
