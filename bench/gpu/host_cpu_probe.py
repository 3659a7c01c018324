"""How steady the GPU machine's cores are (issue 42's step-time method).

overhead_job.py brackets each turn with a fixed loop of Python bytecode
(the probe); its time moved 10.8-28.2 ms within one call. This asks where
that comes from, with no GPU work and nothing else of ours running:

  1. one core, 200 probes 20 ms apart: does its speed move on its own?
  2. every core alone, 15 probes each;
  3. core 0 while a spinning process runs on each other core in turn, and
     on all of them: which of the guest's own cores slow core 0 (hardware
     threads of one physical core that the guest is not told of)?

    python bench/gpu/host_cpu_probe.py [--json OUT]

The probe is overhead_job.py's (300,000 iterations of `total += i`).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROBE_ITERATIONS = 300_000
SPIN = "while True: pass"


def probe_ms():
    start = time.perf_counter()
    total = 0
    for i in range(PROBE_ITERATIONS):
        total += i
    return (time.perf_counter() - start) * 1e3


def probes_on(cpu, n, gap_s=0.0):
    os.sched_setaffinity(0, [cpu])
    out = []
    for _ in range(n):
        out.append(probe_ms())
        time.sleep(gap_s)
    return out


def summary(values):
    fastest = min(values)
    return {"min": fastest, "median": statistics.median(values), "max": max(values),
            "slow": sum(v > 1.3 * fastest for v in values), "n": len(values)}


def line(values):
    s = summary(values)
    return (f"min {s['min']:.1f} median {s['median']:.1f} max {s['max']:.1f} ms, "
            f"{s['slow']} of {s['n']} over 1.3x the fastest")


def spinners(cpus):
    return [subprocess.Popen([sys.executable, "-c", SPIN],
                             preexec_fn=lambda c=c: os.sched_setaffinity(0, [c])) for c in cpus]


def with_spinners(cpus, n):
    spinning = spinners(cpus)
    time.sleep(0.3)
    try:
        return probes_on(0, n)
    finally:
        for p in spinning:
            p.kill()
            p.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="also write every probe here")
    a = p.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    result = {"cpus": cpus}
    timeline = probes_on(0, 200, 0.02)
    result["core0_timeline"] = timeline
    print(f"core 0 alone, 200 probes 20 ms apart: {line(timeline)}")
    print("  " + " ".join(f"{v:.0f}" for v in timeline))
    result["alone"] = {}
    for cpu in cpus:
        result["alone"][cpu] = probes_on(cpu, 15)
        print(f"core {cpu} alone: {line(result['alone'][cpu])}")
    result["core0_beside"] = {}
    for cpu in cpus[1:]:
        result["core0_beside"][cpu] = with_spinners([cpu], 20)
        print(f"core 0, a spinner on core {cpu}: {line(result['core0_beside'][cpu])}")
    result["core0_beside_all"] = with_spinners(cpus[1:], 40)
    print(f"core 0, spinners on all other cores: {line(result['core0_beside_all'])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
