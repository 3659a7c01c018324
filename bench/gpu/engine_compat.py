#!/usr/bin/env python3
"""allocd.enable(mode="engine") against native PyTorch on a GPU: what
PyTorch's users and libraries call on the allocator (issue 13, deliver 4).

Each mode runs in its own process (an allocator is chosen once per process):
  native  PyTorch's own allocator;
  engine  allocd.enable(mode="engine") on a daemon this script starts.
Checks, each ok/failed with what it saw:
  stats        the memory-stats family under torch.cuda, torch.cuda.memory and
               torch.accelerator: values follow the tensors, resets work,
               memory_summary formats, engine mode agrees with allocd.stats();
  snapshot     _record_memory_history + _snapshot/memory_snapshot +
               _dump_snapshot, then `python -m torch.cuda._memory_viz`
               (stats, trace, trace_plot, segment_plot) on the dump;
  oom          an allocation that cannot fit raises torch.OutOfMemoryError,
               num_ooms counts it, and the process goes on computing;
  empty_cache  reserved memory drops after empty_cache();
  reduce_overhead  torch.compile(mode="reduce-overhead") (engine mode is
               expected to fail here: CUDA-graph trees need PyTorch's pools).
Prints one JSON document: {"modes": {mode: {"checks": {...}}}, "summary"}
(and writes it to --json FILE).

  PYTHONPATH=.gpu/python LD_LIBRARY_PATH=.gpu/lib \\
      python bench/gpu/engine_compat.py --allocd .gpu/bin/allocd > engine_compat.json

Exit status 0 when every check expected to pass in each mode passed.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

MiB = 1 << 20
CHECKS = ("stats", "snapshot", "oom", "empty_cache", "reduce_overhead")
# Expected to fail in engine mode (documented in allocd/_engine.py).
ENGINE_UNSUPPORTED = {"reduce_overhead"}


def check(results, name, progress):
    """Decorator: runs the check, recording its details or its error, and
    saves the results so far to `progress` (a check may crash the process)."""
    def run(fn):
        started = time.monotonic()
        try:
            details = fn() or {}
            results[name] = {"ok": True, **details}
        except Exception as error:  # a failed check is a result, not a crash
            results[name] = {"ok": False, "error": f"{type(error).__name__}: {error}",
                             "traceback": traceback.format_exc(limit=4)}
        results[name]["seconds"] = round(time.monotonic() - started, 3)
        with open(progress, "w") as f:
            json.dump(results, f)
        return fn
    return run


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


def child(mode, socket, workdir):
    import torch

    if mode == "engine":
        import allocd
        allocd.enable(socket=socket, job="engine-compat", mode="engine", required=True)
    dev = torch.device("cuda", 0)
    results = {}
    progress = progress_path(workdir, mode)
    if os.path.exists(progress):
        os.remove(progress)
    namespaces = {"torch.cuda": torch.cuda, "torch.cuda.memory": torch.cuda.memory,
                  "torch.accelerator": getattr(torch, "accelerator", None)}
    readers = ("memory_allocated", "max_memory_allocated", "memory_reserved",
               "max_memory_reserved")

    @check(results, "stats", progress)
    def _():
        seen = {}
        x = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)
        small = torch.ones(1000, device=dev)
        for label, module in namespaces.items():
            if module is None:
                seen[label] = "absent"
                continue
            for name in readers + ("memory_stats",):
                if not hasattr(module, name):
                    seen[f"{label}.{name}"] = "absent"
                    continue
                for args in ((), (0,), (dev,)):
                    value = getattr(module, name)(*args)
                    if name == "memory_stats":
                        expect(value.get("allocated_bytes.all.current", 0) >= 64 * MiB,
                               f"{label}.memory_stats{args}: {len(value)} keys, allocated "
                               f"{value.get('allocated_bytes.all.current')}")
                        value = len(value)
                    seen[f"{label}.{name}{args}"] = value
            if hasattr(module, "memory_stats_as_nested_dict"):
                nested = module.memory_stats_as_nested_dict()
                expect(nested["allocated_bytes"]["all"]["current"] >= 64 * MiB,
                       f"{label}.memory_stats_as_nested_dict")
        allocated = torch.cuda.memory_allocated()
        expect(allocated >= 64 * MiB + 4000, f"memory_allocated {allocated}")
        expect(torch.cuda.memory_reserved() >= allocated, "reserved < allocated")
        expect(torch.accelerator.memory_allocated() == allocated
               if hasattr(torch, "accelerator") else True, "accelerator disagrees")
        summary = torch.cuda.memory_summary()
        expect("memory summary" in summary, "memory_summary")
        seen["memory_summary_lines"] = summary.count("\n")

        del x
        expect(torch.cuda.max_memory_allocated() >= 64 * MiB, "peak kept the tensor")
        for label, module in namespaces.items():
            if module is None or not hasattr(module, "reset_peak_memory_stats"):
                continue
            module.reset_peak_memory_stats()
            peak = module.max_memory_allocated()
            expect(peak == module.memory_allocated() and peak < 64 * MiB,
                   f"{label}.reset_peak_memory_stats left peak {peak}")
            module.reset_accumulated_memory_stats()
            acc = module.memory_stats()["allocated_bytes.all.allocated"]
            expect(acc == 0, f"{label}.reset_accumulated_memory_stats left {acc}")
        torch.cuda.memory.reset_peak_memory_stats(0)
        torch.cuda.memory.reset_accumulated_memory_stats(dev)
        if mode == "engine":
            import allocd
            engine = allocd.stats()
            seen["allocd_stats_allocated"] = engine["allocated_bytes.all.current"]
            expect(engine["allocated_bytes.all.current"] == torch.cuda.memory_allocated(),
                   "allocd.stats() and torch.cuda.memory_allocated() disagree")
        del small
        return {"values": seen}

    @check(results, "snapshot", progress)
    def _():
        torch.cuda.memory._record_memory_history(max_entries=100000)
        tensors = [torch.empty(n * MiB, dtype=torch.uint8, device=dev) for n in (1, 3, 30)]
        tensors.append(torch.ones(100, device=dev))
        del tensors[1]
        snapshot = torch.cuda.memory._snapshot()
        segments = torch.cuda.memory_snapshot()
        path = os.path.join(workdir, f"{mode}_snapshot.pickle")
        torch.cuda.memory._dump_snapshot(path)
        torch.cuda.memory._record_memory_history(enabled=None)
        trace = [e for t in snapshot["device_traces"] for e in t]
        actions = sorted({e["action"] for e in trace})
        expect(segments, "memory_snapshot() has no segments")
        expect({"alloc", "free_requested", "free_completed"} <= set(actions),
               f"device_traces actions {actions}")
        live = sum(b["size"] for s in snapshot["segments"] for b in s["blocks"]
                   if b["state"] == "active_allocated")
        expect(live == torch.cuda.memory_allocated(),
               f"active_allocated blocks {live} vs memory_allocated "
               f"{torch.cuda.memory_allocated()}")
        viz = {}
        for command, extra in (("stats", []), ("trace", []),
                               ("trace_plot", ["-o", path + ".trace.html"]),
                               ("segment_plot", ["-o", path + ".segments.html"])):
            run = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", command,
                                  path, *extra], capture_output=True, text=True, timeout=300)
            viz[command] = {"rc": run.returncode, "stderr": run.stderr[-300:]}
            expect(run.returncode == 0, f"_memory_viz {command}: {run.stderr[-300:]}")
        del tensors
        return {"segments": len(snapshot["segments"]), "trace_events": len(trace),
                "actions": actions, "memory_viz": viz, "dump_bytes": os.path.getsize(path)}

    @check(results, "oom", progress)
    def _():
        ooms = torch.cuda.memory_stats().get("num_ooms", 0)
        total = torch.cuda.get_device_properties(0).total_memory
        raised = None
        try:
            torch.empty(2 * total, dtype=torch.uint8, device=dev)
        except Exception as error:  # the type is the point of the check
            raised = error
        expect(raised is not None, "nothing raised")
        name = type(raised).__module__ + "." + type(raised).__qualname__
        expect(isinstance(raised, torch.OutOfMemoryError), f"raised {name}: {raised}")
        expect(isinstance(raised, RuntimeError), "not a RuntimeError")
        after = torch.cuda.memory_stats().get("num_ooms", 0)
        expect(after == ooms + 1, f"num_ooms {ooms} -> {after}")
        a = torch.randn(1024, 1024, device=dev)
        value = float((a @ a).sum())
        torch.cuda.synchronize()
        details = {"raised": name, "message": str(raised).splitlines()[0][:200],
                   "goes_on": value == value}
        if mode == "engine":
            import allocd
            details["allocd_throws_c10_oom"] = allocd._state.managed.oom_is_torch_error()
        return details

    @check(results, "empty_cache", progress)
    def _():
        x = torch.empty(256 * MiB, dtype=torch.uint8, device=dev)
        del x
        before = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        after = torch.cuda.memory_reserved()
        expect(after <= before - 256 * MiB, f"reserved {before} -> {after}")
        return {"reserved_before": before, "reserved_after": after}

    @check(results, "reduce_overhead", progress)
    def _():
        f = torch.compile(lambda t: (t * 2).sin() + 1, mode="reduce-overhead")
        t = torch.randn(4096, device=dev)
        for _ in range(4):
            out = f(t)
        torch.cuda.synchronize()
        expect(torch.allclose(out, (t * 2).sin() + 1), "wrong result")
        return {}

    return {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
            "checks": results}


def progress_path(workdir, mode):
    return os.path.join(workdir, f"{mode}_checks.json")


def start_daemon(binary, socket, capacity, log):
    daemon = subprocess.Popen([binary, "serve", "--backend", "cuda", "--socket", socket,
                               "--metrics-addr", "", "--capacity", capacity],
                              stderr=log)
    for _ in range(400):
        if os.path.exists(socket):
            return daemon
        if daemon.poll() is not None:
            break
        time.sleep(0.05)
    daemon.kill()
    raise SystemExit(f"allocd serve did not start (see {log.name})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocd", help="the allocd binary (started for engine mode)")
    parser.add_argument("--socket", help="a running daemon's socket instead of --allocd")
    parser.add_argument("--capacity", default="16GiB", help="the daemon's pool")
    parser.add_argument("--modes", default="native,engine")
    parser.add_argument("--workdir", help="where snapshots and logs go (default: a temp dir)")
    parser.add_argument("--json", help="also write the report to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="engine_compat_")
    os.makedirs(workdir, exist_ok=True)

    if args.child:
        print(json.dumps(child(args.child, args.socket, workdir)))
        return 0

    report = {"workdir": workdir, "modes": {}}
    daemon = None
    socket = args.socket
    modes = args.modes.split(",")
    if "engine" in modes and socket is None:
        if not args.allocd:
            raise SystemExit("engine mode needs --allocd BINARY or --socket PATH")
        socket = os.path.join(workdir, "allocd.sock")
        log = open(os.path.join(workdir, "daemon.log"), "w")
        daemon = start_daemon(args.allocd, socket, args.capacity, log)
    try:
        for mode in modes:
            run = subprocess.run([sys.executable, __file__, "--child", mode, "--workdir",
                                  workdir] + (["--socket", socket] if socket else []),
                                 capture_output=True, text=True, timeout=1200)
            try:
                report["modes"][mode] = json.loads(run.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                # The checks that finished before the process died.
                progress = progress_path(workdir, mode)
                checks = json.load(open(progress)) if os.path.exists(progress) else {}
                report["modes"][mode] = {"crashed": True, "rc": run.returncode,
                                         "stderr": run.stderr[-3000:], "checks": checks}
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait()

    summary, ok = {}, True
    for mode, result in report["modes"].items():
        checks = result.get("checks", {})
        summary[mode] = {name: c["ok"] for name, c in checks.items()}
        expected_failures = ENGINE_UNSUPPORTED if mode == "engine" else set()
        if any(not checks.get(n, {"ok": False})["ok"] for n in CHECKS
               if n not in expected_failures):
            ok = False
    report["summary"] = summary
    report["all_expected_passed"] = ok
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
