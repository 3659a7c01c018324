#!/usr/bin/env python3
"""End to end: a real Prometheus server (Debian's `prometheus`) on loopback
scrapes a running `allocd serve --backend sim` with two `allocd
client-replay` clients every second, with deploy/prometheus/allocd-rules.yaml
loaded, and is queried through its HTTP API:

  - allocd_reserved_bytes returns a series for each of the two sessions,
    labelled with the training jobs' names (honor_labels, as deployed);
  - up{job="allocd"} is 1, and every alert rule evaluates without error;
  - the config file is mounted the way the kubelet mounts a ConfigMap
    (config.json -> ..data/config.json, ..data -> a timestamped directory);
    swapping ..data to a good version pushes it (the job's config version
    moves); swapping it to a version the daemon must reject fires
    AllocdConfigReloadFailed in Prometheus; a 1 GiB quota on one session
    makes it run out of memory, and AllocdJobOOM fires for its job;
  - every query of the dashboard and the alerts is valid PromQL for this
    Prometheus; the number that return data is printed.

Skips when the prometheus binary is not installed.

    prometheus_e2e_test.py ALLOCD_BINARY ALLOCCTL_BINARY
"""
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse

import deploylib as d

PROM_CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {rules}
scrape_configs:
  - job_name: allocd
    # As the ServiceMonitor: keep the sessions' own "job" label.
    honor_labels: true
    static_configs:
      - targets: ["127.0.0.1:{port}"]
        labels:
          node: e2e-node
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def configmap_mount(directory, text, version):
    """Writes config.json the way the kubelet updates a ConfigMap volume: a
    new timestamped directory, then an atomic swap of the ..data symlink."""
    data = directory / f"..{version}"
    data.mkdir()
    (data / "config.json").write_text(text)
    tmp = directory / "..data_tmp"
    os.symlink(data.name, tmp)
    os.replace(tmp, directory / "..data")
    link = directory / "config.json"
    if not link.is_symlink():
        os.symlink("..data/config.json", link)
    return link


class Prometheus:
    def __init__(self, base):
        self.base = base

    def api(self, path, **params):
        url = f"{self.base}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            body = d.http_get(url, timeout=10)
        except urllib.error.HTTPError as e:  # 400/422: a bad query
            body = e.read().decode()
        return json.loads(body)

    def query(self, expr):
        return self.api("query", query=expr)

    def firing(self):
        alerts = self.api("alerts")["data"]["alerts"]
        return {a["labels"]["alertname"]: a for a in alerts if a["state"] == "firing"}


def wait_for(what, check, timeout, procs_to_watch=()):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        for proc in procs_to_watch:
            if proc.poll() is not None:
                d.fail(f"{what}: {proc.args[0]} exited with {proc.returncode}:\n"
                       f"{d.tail(proc.log_path)}")
        if time.monotonic() > deadline:
            d.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.25)


def start_prometheus(procs, prometheus, work):
    for attempt in range(3):
        port = free_port()
        proc = procs.start(
            [prometheus, f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            work / f"prometheus-{attempt}.log")
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if "Ready" in d.http_get(f"{base}/-/ready", timeout=1):
                    return proc, Prometheus(base)
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        log = d.tail(proc.log_path)
        procs.stop(proc)
        if "address already in use" not in log:
            d.fail(f"prometheus did not become ready:\n{log}")
    d.fail("prometheus: no free loopback port after 3 tries")


def main():
    if len(sys.argv) != 3:
        d.fail(__doc__)
    allocd, allocctl = sys.argv[1:]
    prometheus = d.require_tool("prometheus", "prometheus")
    started = time.monotonic()
    work = d.temp_dir("allocd-prom-")
    try:
        with d.Procs() as procs:
            etc = work / "etc"
            etc.mkdir()
            config = configmap_mount(etc, d.CONFIG_JSON.read_text(), "2025_01_01_00_00_00.1")
            daemon, sock, metrics_port = d.start_daemon(procs, allocd, work, capacity="32GiB",
                                                        config=config)
            clients = d.start_clients(procs, allocd, work, sock, duration=40)
            shutil.copy(d.RULES, work / "allocd-rules.yaml")
            (work / "prometheus.yml").write_text(PROM_CONFIG.format(
                rules=work / "allocd-rules.yaml", port=metrics_port))
            prom_proc, prom = start_prometheus(procs, prometheus, work)
            watch = [daemon, prom_proc]
            d.log(f"prometheus ready at {prom.base} after {time.monotonic() - started:.1f} s, "
                  f"scraping allocd at 127.0.0.1:{metrics_port} every 1 s")

            # allocd_reserved_bytes, one series per session, through the API.
            def two_sessions():
                result = prom.query("allocd_reserved_bytes")
                series = result.get("data", {}).get("result", [])
                sessions = {s["metric"].get("session") for s in series}
                jobs = {s["metric"].get("job") for s in series}
                if len(sessions) >= 2 and {"llama-lora", "gpt2-full"} <= jobs:
                    return series
                return None

            series = wait_for("allocd_reserved_bytes for both sessions", two_sessions, 25, watch)
            d.log(f"query allocd_reserved_bytes: {len(series)} series after "
                  f"{time.monotonic() - started:.1f} s")
            for s in series:
                m = s["metric"]
                d.log(f"  job={m.get('job')} session={m.get('session')} pid={m.get('pid')} "
                      f"device={m.get('device')} node={m.get('node')}: "
                      f"{float(s['value'][1]) / 2**30:.2f} GiB reserved")

            up = prom.query('up{job="allocd"}')["data"]["result"]
            if not up or up[0]["value"][1] != "1":
                d.fail(f'up{{job="allocd"}} is not 1: {up}')
            d.log('query up{job="allocd"}: 1')

            # The ConfigMap changes: a good version is applied and pushed to
            # llama-lora's session (its config version moves)...
            def llama_version():
                result = prom.query('max(allocd_config_version{job="llama-lora"})')
                return float(result["data"]["result"][0]["value"][1])

            before = llama_version()
            good = json.loads(d.CONFIG_JSON.read_text())
            good["jobs"]["llama-lora"] = "expandable_segments:True,roundup_power2_divisions:2"
            configmap_mount(etc, json.dumps(good, indent=2), "2025_01_01_00_02_00.2")

            def pushed():
                version = prom.query('max(allocd_config_version{job="llama-lora"})')
                reloads = prom.query("allocd_config_reloads_total")
                version = version["data"]["result"]
                reloads = reloads["data"]["result"]
                if (version and float(version[0]["value"][1]) > before and reloads
                        and float(reloads[0]["value"][1]) >= 2):
                    return version[0]["value"][1], reloads[0]["value"][1]
                return None

            version, reloads = wait_for("the good ConfigMap version to be pushed", pushed, 20,
                                        watch)
            changes = prom.query('sum by (job) (changes(allocd_config_version[2m])) > 0')
            d.log(f"ConfigMap swapped to a good version: allocd_config_reloads_total={reloads}, "
                  f"llama-lora's allocd_config_version {before:g} -> {version}; "
                  f"config-version annotation query finds changes for job(s) "
                  + ", ".join(r["metric"].get("job", "?") for r in changes["data"]["result"]))
            if not changes["data"]["result"]:
                d.fail("the dashboard's config-version annotation query sees no change")

            # ...then to a version the daemon must reject.
            bad = json.loads(d.CONFIG_JSON.read_text())
            bad["jobs"]["llama-lora"] = "max_split_size_mb:banana"
            configmap_mount(etc, json.dumps(bad, indent=2), "2025_01_01_00_05_00.3")
            firing = wait_for("AllocdConfigReloadFailed to fire",
                              lambda: prom.firing() if "AllocdConfigReloadFailed"
                              in prom.firing() else None, 20, watch)
            d.log("ConfigMap swapped to a bad version: "
                  f"allocd_config_reload_errors_total="
                  f"{prom.query('allocd_config_reload_errors_total')['data']['result'][0]['value'][1]}, "
                  f"alert AllocdConfigReloadFailed firing: "
                  f"{firing['AllocdConfigReloadFailed']['annotations']['summary']}")

            # A 1 GiB quota on gpt2-full's session: it runs out of memory,
            # and AllocdJobOOM fires for that job.
            gpt2 = next(s["metric"]["session"] for s in series
                        if s["metric"].get("job") == "gpt2-full")
            subprocess.run([allocctl, "--socket", str(sock), "quota", "set", "--session", gpt2,
                            "1GiB"], check=True, capture_output=True, timeout=10)
            firing = wait_for("AllocdJobOOM to fire for gpt2-full",
                              lambda: [a for a in prom.api("alerts")["data"]["alerts"]
                                       if a["labels"]["alertname"] == "AllocdJobOOM"
                                       and a["state"] == "firing"
                                       and a["labels"].get("job") == "gpt2-full"], 20, watch)
            ooms = prom.query('sum(allocd_ooms_total{job="gpt2-full"})')["data"]["result"]
            d.log(f"1 GiB quota on gpt2-full's session {gpt2}: {ooms[0]['value'][1]} OOMs, "
                  f"alert AllocdJobOOM firing: {firing[0]['annotations']['summary']}")

            # Every alert rule evaluated without error.
            groups = prom.api("rules")["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            bad_rules = [(r["name"], r.get("lastError")) for r in rules
                         if r.get("health") != "ok"]
            if len(rules) < len(d.alert_names()) or bad_rules:
                d.fail(f"rules not all healthy: {len(rules)} loaded, errors: {bad_rules}")
            d.log(f"{len(rules)} alert rules loaded and evaluated without error")

            # Every dashboard and alert query: valid here, and how many have data.
            wait_for("rates over 2+ samples", lambda: prom.query(
                "sum(rate(allocd_rpc_duration_seconds_count[1m]))")["data"]["result"], 10, watch)
            queries = [(w, d.grafana_to_promql(e)) for w, e in d.dashboard_exprs()]
            queries += [(f"alert {n}", e) for n, e in d.rule_exprs()]
            empty = []
            for where, expr in queries:
                result = prom.query(expr)
                if result.get("status") != "success":
                    d.fail(f"{where}: Prometheus rejects {expr!r}: {result.get('error')}")
                if not result["data"]["result"]:
                    empty.append(where)
            d.log(f"{len(queries)} dashboard and alert queries valid; "
                  f"{len(queries) - len(empty)} returned data")
            for where in empty:
                d.log(f"  no data (nothing to show in this run): {where}")
            must_have_data = ("Reserved vs allocated", "Fragmentation ratio", "Pool usage",
                              "RPC latency", "Sessions", "Config version per job")
            for title in must_have_data:
                if any(title in w for w in empty):
                    d.fail(f"dashboard panel {title!r} shows no data against a live daemon")
            for c in clients:
                if c.poll() is not None and c.returncode != 0:
                    d.fail(f"client exited {c.returncode}:\n{d.tail(c.log_path)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    d.log(f"PASS in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
