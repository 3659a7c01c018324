"""Shared helpers of the deploy tests (python3 standard library only).

Every process a test starts dies with the test: children get
PR_SET_PDEATHSIG(SIGKILL), so even a test that ctest kills on timeout leaves
nothing behind, and Procs.stop_all() ends them (SIGTERM, then SIGKILL) on
any normal or failing exit.
"""
import ctypes
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

SKIP = 77  # ctest SKIP_RETURN_CODE

SOURCE_DIR = pathlib.Path(
    os.environ.get("ALLOCD_SOURCE_DIR")
    or pathlib.Path(__file__).resolve().parents[2]).resolve()
DEPLOY = SOURCE_DIR / "deploy"
RULES = DEPLOY / "prometheus" / "allocd-rules.yaml"
RULES_TEST = DEPLOY / "prometheus" / "allocd-rules.test.yaml"
DASHBOARD = DEPLOY / "grafana" / "allocd-dashboard.json"
CONFIG_JSON = DEPLOY / "k8s" / "base" / "config.json"
TRACES = SOURCE_DIR / "traces"

def log(*args):
    print(*args, flush=True)


def skip(why):
    log(f"SKIP: {why}")
    sys.exit(SKIP)


def fail(why):
    log(f"FAIL: {why}")
    sys.exit(1)


def require_tool(name, package):
    path = shutil.which(name)
    if path is None:
        skip(f"`{name}` is not installed (Debian package {package}; "
             f"scripts/install-deps installs it)")
    return path


def _die_with_parent():
    # PR_SET_PDEATHSIG = 1: the kernel sends SIGKILL when this test dies.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


class Procs:
    """Processes started by a test, ended together (with SIGTERM first)."""

    def __init__(self):
        self.procs = []
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, _frame):
        self.stop_all()
        sys.exit(128 + signum)

    def start(self, argv, log_path, **kwargs):
        out = open(log_path, "wb")
        proc = subprocess.Popen([str(a) for a in argv], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent, **kwargs)
        proc.log_path = log_path
        out.close()
        self.procs.append(proc)
        return proc

    def stop(self, proc, timeout=5):
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self):
        for proc in reversed(self.procs):
            self.stop(proc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop_all()
        return False


def tail(path, lines=30):
    try:
        text = pathlib.Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def temp_dir(prefix):
    # Short: Unix socket paths are limited to 107 bytes.
    return pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def start_daemon(procs, allocd, workdir, capacity="32GiB", config=None):
    """allocd serve --backend sim on a socket in workdir, /metrics on a free
    loopback port (--metrics-addr 127.0.0.1:0; the port is read from its log).
    Returns (proc, socket path, metrics port)."""
    sock = workdir / "a.sock"
    argv = [allocd, "serve", "--socket", sock, "--backend", "sim",
            "--capacity", capacity, "--metrics-addr", "127.0.0.1:0"]
    if config is not None:
        argv += ["--config", config]
    proc = procs.start(argv, workdir / "allocd.log")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail(f"allocd serve exited with {proc.returncode}:\n{tail(proc.log_path)}")
        match = re.search(r"metrics on port (\d+)",
                          pathlib.Path(proc.log_path).read_text(errors="replace"))
        if match and sock.exists():
            return proc, sock, int(match.group(1))
        time.sleep(0.05)
    fail(f"allocd serve did not start in 15 s:\n{tail(proc.log_path)}")


def start_clients(procs, allocd, workdir, sock, duration):
    """Two `allocd client-replay` clients of the shipped traces, as the jobs
    that deploy/k8s/base/config.json names."""
    clients = []
    for job, trace in (("llama-lora", "llama_lora.pickle.gz"),
                       ("gpt2-full", "gpt2_full.pickle.gz")):
        clients.append(procs.start(
            [allocd, "client-replay", TRACES / trace, "--socket", sock,
             "--job", job, "--duration", duration],
            workdir / f"client-{job}.log"))
    return clients


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def exposition_names(text):
    """Sample names in a Prometheus text exposition (histograms: _bucket,
    _sum, _count)."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def exposition_series(text, name):
    return [line for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")]


# --- the PromQL that the alerts and the dashboard run ----------------------

def rule_exprs(path=RULES):
    """(alert name, expr) of each rule, from the rules file's text: an `expr:`
    with an inline value or a block scalar (| or >) below it."""
    lines = pathlib.Path(path).read_text().splitlines()
    out = []
    name = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\s*-?\s*(alert|record):\s*(\S+)", line)
        if m:
            name = m.group(2)
        m = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if m:
            indent, value = len(m.group(1)), m.group(2).strip()
            if value and value[0] not in "|>":
                out.append((name, value.strip("'\"")))
            else:
                block = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or
                                          len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i].strip())
                    i += 1
                out.append((name, "\n".join(b for b in block if b)))
                continue
        i += 1
    return out


def alert_names(path=RULES):
    return re.findall(r"^\s*- alert:\s*(\S+)", pathlib.Path(path).read_text(), re.M)


def dashboard_exprs(path=DASHBOARD):
    """(where, PromQL) of every query in the dashboard: panel targets,
    annotations and template variables."""
    dash = json.loads(pathlib.Path(path).read_text())
    out = []

    def panels(items):
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dash.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append((f"panel {panel.get('title')!r} {target.get('refId')}",
                            target["expr"]))
    for ann in dash.get("annotations", {}).get("list", []):
        if ann.get("expr"):
            out.append((f"annotation {ann.get('name')!r}", ann["expr"]))
    for var in dash.get("templating", {}).get("list", []):
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if var.get("type") == "query" and query:
            out.append((f"variable ${var.get('name')}", query))
    return out


def metric_names(expr):
    """allocd_* metric names and `up` in a PromQL expression (label values
    and strings are skipped)."""
    code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    names = set(re.findall(r"\ballocd_[A-Za-z0-9_]+", code))
    if re.search(r"\bup\b", code):
        names.add("up")
    return names


def grafana_to_promql(expr):
    """Grafana's template variables made concrete, for Prometheus' API."""
    for var, value in (("$__rate_interval", "1m"), ("$__interval", "15s"),
                       ("$__range", "5m"), ("$node", ".*"), ("$gpu", ".*"),
                       ("$job", ".*")):
        expr = expr.replace(var, value)
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", expr, re.S)
    if m:  # label_values(SELECTOR, LABEL): query the selector itself
        expr = m.group(1)
    return expr
