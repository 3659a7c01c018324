#!/usr/bin/env python3
"""Every metric that the alerts and the dashboard query is in the /metrics of
a running `allocd serve --backend sim` with clients.

Starts the daemon with deploy/k8s/base/config.json (so the shipped ConfigMap
is also checked to load) and two `allocd client-replay` clients, pushes a
config with a predicted peak to one job (so config push results and the
prediction exist), scrapes /metrics and
compares its sample names with the names in the alerts' and the dashboard's
PromQL. `up` is Prometheus' own (prometheus_e2e_test checks it).

    metrics_exist_test.py ALLOCD_BINARY ALLOCCTL_BINARY
"""
import shutil
import subprocess
import sys
import time

import deploylib as d


def wanted_names():
    wanted = {}
    for name, expr in d.rule_exprs():
        for metric in d.metric_names(expr):
            wanted.setdefault(metric, []).append(f"alert {name}")
    for where, expr in d.dashboard_exprs():
        for metric in d.metric_names(expr):
            wanted.setdefault(metric, []).append(f"dashboard {where}")
    wanted.pop("up", None)
    return wanted


def main():
    if len(sys.argv) != 3:
        d.fail(__doc__)
    allocd, allocctl = sys.argv[1:]
    wanted = wanted_names()
    if len(wanted) < 10:
        d.fail(f"found only {sorted(wanted)} in the alerts and the dashboard")
    work = d.temp_dir("allocd-metrics-")
    try:
        with d.Procs() as procs:
            config = work / "config.json"
            shutil.copy(d.CONFIG_JSON, config)
            _, sock, port = d.start_daemon(procs, allocd, work, config=config)
            clients = d.start_clients(procs, allocd, work, sock, duration=20)
            url = f"http://127.0.0.1:{port}/metrics"
            pushed = False
            deadline = time.monotonic() + 25
            while True:
                text = d.http_get(url)
                names = d.exposition_names(text)
                sessions = d.exposition_series(text, "allocd_reserved_bytes")
                if len(sessions) >= 2 and not pushed:
                    # A config push to one job, with allocd tune's prediction
                    # for it: its sessions ACK it, so allocd_config_pushes_total
                    # and allocd_config_predicted_peak_reserved_bytes have series.
                    subprocess.run([allocctl, "--socket", str(sock), "config", "set",
                                    "--job", "llama-lora", "expandable_segments:True",
                                    "--predicted-peak-reserved", "4802478080"],
                                   check=True, capture_output=True, timeout=10)
                    pushed = True
                missing = {n for n in wanted if n not in names}
                if pushed and len(sessions) >= 2 and not missing:
                    break
                if time.monotonic() > deadline:
                    logs = "\n".join(f"--- {c.log_path}\n{d.tail(c.log_path, 10)}"
                                     for c in clients)
                    d.fail("not in /metrics after 25 s: " + ", ".join(
                        f"{n} (queried by {', '.join(sorted(set(wanted[n]))[:3])})"
                        for n in sorted(missing)) +
                        f"\n{len(sessions)} session(s) seen\n{logs}")
                for c in clients:
                    if c.poll() is not None and c.returncode != 0:
                        d.fail(f"client exited {c.returncode}:\n{d.tail(c.log_path)}")
                time.sleep(0.2)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    allocd_names = sorted(n for n in names if n.startswith("allocd_"))
    d.log(f"/metrics of allocd serve with 2 clients: {len(allocd_names)} allocd_* sample "
          f"names, {len(sessions)} sessions")
    for name in sorted(wanted):
        where = sorted(set(w.split(" ", 1)[0] for w in wanted[name]))
        d.log(f"  {name:40} exported; queried by {' and '.join(where)}")
    unused = sorted(n for n in allocd_names if n not in wanted and
                    not n.endswith(("_sum", "_count")))
    if unused:
        d.log(f"exported but not queried: {', '.join(unused)}")
    d.log(f"PASS: all {len(wanted)} metric names that the alerts and the dashboard "
          f"query are exported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
