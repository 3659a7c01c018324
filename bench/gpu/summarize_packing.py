"""The tables of bench/gpu/packing.sh's results (markdown, on stdout).

    python bench/gpu/summarize_packing.py OUT
    python bench/gpu/summarize_packing.py --trainer-slot OUT
    python bench/gpu/summarize_packing.py --across OUT [OUT...]

One row per part, N and mode: jobs that ran without an OOM, the OOMs
(peaks, steps, requests), peaks held, the jobs' step time (median of their
p50 and p99) against the same kind alone in that mode, and the peaks'
gather times: under allocd, a peak past the first cycle comes back from its
neighbours' caches, so its gather time is the reclaim latency a job feels.
Then where a reclaimed gather's time went under allocd (the jobs' map-path
counters): the daemon's round trips for chunks (a reclaim waits in them),
importing and mapping the chunks, enabling access, and the rest (PyTorch's
allocator, the kernel launches, Python). Then what answering reclaims cost
the jobs that gave memory back. Then the server beside the trainer
against the server alone and against the floor (native, its batch halved
so that both jobs fit: the GPU's compute shared, no memory moved), each run
pooled over its repeats where they were repeated (SERVER_REPEATS), and
where its slowest requests came.
With --across OUT..., only the server's runs of several calls together
(packing.sh SERVER_REPEATS): each run's requests pooled over every call's
repeats, and each repeat beside a trainer against its own repeat's server
alone and floor.
With --trainer-slot, only the server's requests by when they arrived around
the trainer's slot (the reclaim that hands the server's batch to the
trainer comes at its start): p50 / p90 / max in each window.
"""
import collections
import glob
import gzip
import json
import math
import os
import re
import statistics
import sys


def percentile(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def load(out):
    """The jobs' results under OUT/packing, as packing.sh wrote them (.json)
    or as a record in the repository keeps them (.json.gz)."""
    runs = collections.defaultdict(list)
    for f in glob.glob(os.path.join(out, "packing", "*.json*")):
        m = re.match(r"(.+)-N(\d+)-(.+)-(\d+)\.json(\.gz)?$", os.path.basename(f))
        if m:
            with (gzip.open if m[5] else open)(f, "rt") as text:
                runs[(m[1], int(m[2]), m[3])].append(json.load(text))
    return runs


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def main():
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--trainer-slot":
        by_trainer_slot(load(args[1]))
    elif len(args) >= 2 and args[0] == "--across":
        across(args[1:])
    elif len(args) == 1 and not args[0].startswith("-"):
        summary(args[0])
    else:
        sys.exit(__doc__)


def across(outs):
    """The server's runs of the calls in `outs` together (--across)."""
    pooled_repeats([server_runs(load(out))[0] for out in outs])


def summary(out):
    """Every table of one call's results in `out`."""
    runs = load(out)
    alone = {}  # (kind, mode) -> step p50 (ms), the median of the alone runs
    for (part, n, mode), jobs in runs.items():
        if part.startswith("alone-"):
            alone.setdefault((jobs[0]["kind"], mode), []).extend(j["step_ms_p50"] for j in jobs)
    alone = {k: statistics.median(v) for k, v in alone.items()}
    base_mode = {"native": "native", "expandable": "native", "empty-cache": "native",
                 "fraction": "native", "transparent": "transparent", "run": "transparent"}

    print("| part | N | mode | jobs with 0 OOMs | OOMs (peaks / steps) | peaks held | "
          "step p50 / p99 (ms) | p50 vs alone | gather p50 / p99 (s) | GiB/s at p50 |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for key in sorted(runs, key=lambda k: (k[0].startswith("alone"), k[0], k[1], k[2])):
        part, n, mode = key
        jobs = sorted(runs[key], key=lambda j: j["index"])
        clean = sum(1 for j in jobs if j["ooms"] == 0 and j["step_ooms"] == 0)
        p50 = statistics.median(j["step_ms_p50"] for j in jobs if j["steps"]) \
            if any(j["steps"] for j in jobs) else None
        p99 = statistics.median(j["step_ms_p99"] for j in jobs if j["steps"]) \
            if any(j["steps"] for j in jobs) else None
        ref = alone.get((jobs[0]["kind"], base_mode.get(mode, mode)))
        # A job's first gather is cold (cudaMalloc, or the daemon making
        # chunks); the later ones are what packing costs.
        gathers = [g for j in jobs for g in j["gather_s"][1:]]
        g50, g99 = percentile(gathers, 50), percentile(gathers, 99)
        gib = statistics.median(j["peak_gib"] for j in jobs)
        rate = gib / g50 if g50 else None
        peaks = sum(j["peaks_held"] for j in jobs)
        print(f"| {part} | {n} | {mode} | {clean} of {len(jobs)} | "
              f"{sum(j['ooms'] for j in jobs)} / {sum(j['step_ooms'] for j in jobs)} | {peaks} | "
              f"{fmt(p50)} / {fmt(p99)} | {fmt(p50 / ref if p50 and ref else None, '.3f')}x | "
              f"{fmt(g50, '.3f')} / {fmt(g99, '.3f')} | {fmt(rate, '.0f')} |")

    cold = [j["gather_s"][0] for (part, n, mode), jobs in runs.items()
            if part == "alone-peaks" and mode == "native" for j in jobs if j["gather_s"]]
    if cold:
        print(f"\nnative cudaMalloc of a {runs[('alone-peaks', 1, 'native')][0]['peak_gib']:g} GiB "
              f"peak (2 GiB tensors, its first gather): {statistics.median(cold):.3f} s median "
              f"of {len(cold)}")

    print("\nWhere a gathered peak's time went under allocd (per gather past the first, "
          "medians; ms):\n")
    print("| part | N | mode | gathers | gather | daemon round trips | import + map | access "
          "| rest | chunks mapped | segments |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in sorted(runs):
        part, n, mode = key
        pairs = [(g, p) for j in runs[key]
                 for g, p in list(zip(j["gather_s"], j.get("gather_paths", [])))[1:]]
        if not pairs:
            continue

        def med(f):
            return statistics.median(f(g, p) for g, p in pairs)
        ms = 1e-6
        print(f"| {part} | {n} | {mode} | {len(pairs)} | {med(lambda g, p: g * 1e3):.1f} | "
              f"{med(lambda g, p: p['acquire_ns'] * ms):.1f} | {med(lambda g, p: p['map_ns'] * ms):.1f} | "
              f"{med(lambda g, p: p['access_ns'] * ms):.1f} | "
              f"{med(lambda g, p: g * 1e3 - (p['acquire_ns'] + p['map_ns'] + p['access_ns']) * ms):.1f} | "
              f"{med(lambda g, p: p['chunks_mapped'] + p['chunks_created']):.0f} | "
              f"{med(lambda g, p: p['segments_mapped']):.0f} |")

    giving_cost(runs)

    servers, trainers = server_runs(runs)
    if any(s.get("mps") for s in servers.values()):
        trainer = next((t for t in trainers.values() if t), None)
        print("\nUnder MPS (packing.sh MPS=1): every job a client of one MPS server" + (
            f", the trainer at client priority {trainer.get('mps_client_priority', 0)} on at "
            f"most {trainer.get('mps_active_thread_percentage', 100)}% of the SMs."
            if trainer else " (the server alone)."))
    print("\n| server | mode | batch (GiB) | requests | OOMs | p50 (ms) | p99 (ms) | p99 vs alone (native where run) "
          "| p99 vs the native floor | p99 past the first 30 s (ms) "
          "| trainer's failed long steps | trainer's step p50 (ms) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    repeated = any(split_repeat(part)[1] > 1 for part, _ in servers)
    for (part, mode), server in in_repeat_order(servers):
        base, repeat = split_repeat(part)
        solo, floor = references(servers, repeat, mode)
        ref = solo["latency_ms_p99"] if solo else None
        low = floor["latency_ms_p99"] if floor and base != "server-alone" else None
        trainer = trainers[(part, mode)]
        print(f"| {SERVER_PARTS[base]}{f' (repeat {repeat})' if repeated else ''} | {mode} | "
              f"{server['peak_gib']:g} | {server['requests']} | "
              f"{server['ooms']} | {server['latency_ms_p50']:.2f} | "
              f"{server['latency_ms_p99']:.2f} | "
              f"{fmt(server['latency_ms_p99'] / ref if ref else None, '.3f')}x | "
              f"{fmt(server['latency_ms_p99'] / low if low else None, '.3f')}x | "
              f"{fmt(p99_past(server.get('requests_at', []), STARTUP_S))} | "
              f"{trainer['ooms'] if trainer else ''} | "
              f"{fmt(trainer['step_ms_p50'] if trainer else None, '.2f')} |")
    if repeated:
        pooled_repeats([servers])
    slowest_requests(servers)
    server_segments(servers)


# The server's runs, by the part's name packing.sh gives them.
SERVER_PARTS = {"server": "beside a trainer", "server-alone": "alone",
                "server-floor": "the floor: beside a trainer, both fit"}


def server_runs(runs):
    """The server's runs, by (part, mode): the server's result, and the
    trainer's beside it (None: alone)."""
    pairs = {(part, mode): jobs for (part, n, mode), jobs in runs.items()
             if split_repeat(part)[0] in SERVER_PARTS}
    servers = {key: next(j for j in jobs if j["kind"] == "server") for key, jobs in pairs.items()}
    trainers = {key: next((j for j in jobs if j["kind"] == "trainer"), None)
                for key, jobs in pairs.items()}
    return servers, trainers


def split_repeat(part):
    """A part's name without its repeat, and the repeat (packing.sh
    SERVER_REPEATS: "server.2" is the server's second run; "server" its
    first)."""
    base, _, repeat = part.partition(".")
    return base, int(repeat) if repeat else 1


def in_repeat_order(servers):
    """The server's runs ((part, mode), result) by run, mode, then repeat."""
    def order(item):
        (part, mode), _ = item
        base, repeat = split_repeat(part)
        return base, mode, repeat
    return sorted(servers.items(), key=order)


def references(servers, repeat, mode):
    """The server alone and the floor of the same repeat. The target's
    reference is the server alone natively; a run without it compares with
    the server alone in the same mode."""
    suffix = f".{repeat}" if repeat > 1 else ""
    solo = servers.get((f"server-alone{suffix}", "native")) or \
        servers.get((f"server-alone{suffix}", mode))
    return solo, servers.get((f"server-floor{suffix}", "native"))


def pooled_repeats(calls):
    """The server's runs over their repeats (packing.sh SERVER_REPEATS), in
    one call or several (`calls`: each call's server runs, server_runs()'s
    first): every request of a run's repeats pooled, against the server
    alone natively and the floor pooled so; then each repeat of the server
    beside a trainer against the server alone natively and the floor of
    its own repeat, the runs nearest it in time."""
    pooled = collections.defaultdict(list)  # (part, mode) -> (arrival s, ms)
    against = collections.defaultdict(list)  # (mode, reference) -> ratios
    for servers in calls:
        for (part, mode), server in in_repeat_order(servers):
            base, repeat = split_repeat(part)
            pooled[(base, mode)].extend(server["requests_at"])
            if base != "server":
                continue
            for name, reference in zip(("alone", "floor"), references(servers, repeat, mode)):
                if reference:
                    against[(mode, name)].append(
                        server["latency_ms_p99"] / reference["latency_ms_p99"])
    p99 = {key: percentile([ms for _, ms in requests], 99) for key, requests in pooled.items()}
    solo, floor = p99.get(("server-alone", "native")), p99.get(("server-floor", "native"))
    print(f"\nThe server's runs over their repeats ({len(calls)} call{'s' if len(calls) > 1 else ''}): "
          "every request of a run's repeats pooled, against the server alone natively and "
          "the floor pooled so.\n")
    print("| server | mode | requests | pooled p50 (ms) | pooled p99 (ms) | vs alone natively "
          "| vs the floor | pooled p99 past the first 30 s (ms) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (base, mode), requests in sorted(pooled.items()):
        print(f"| {SERVER_PARTS[base]} | {mode} | {len(requests)} | "
              f"{fmt(percentile([ms for _, ms in requests], 50))} | {fmt(p99[(base, mode)])} | "
              f"{fmt(p99[(base, mode)] / solo if solo else None, '.3f')}x | "
              f"{fmt(p99[(base, mode)] / floor if floor else None, '.3f')}x | "
              f"{fmt(p99_past(requests, STARTUP_S))} |")
    if not against:
        return
    print("\nEach repeat of the server beside a trainer: its p99 against the server alone "
          "natively, and against the floor, of the same repeat.\n")
    print("| mode | against | repeats | median | range | within 5% | each |")
    print("|---|---|---:|---:|---|---:|---|")
    for (mode, name), ratios in sorted(against.items()):
        print(f"| {mode} | {name} | {len(ratios)} | {statistics.median(ratios):.3f}x | "
              f"{min(ratios):.3f}-{max(ratios):.3f}x | {sum(r <= 1.05 for r in ratios)} | "
              f"{', '.join(f'{r:.3f}' for r in ratios)} |")


# A process's first seconds under allocd differ from the rest: the
# advisor's quick rounds (QUICK_START_S) and the pre-warm's learning of a
# recurring peak. The server's p99 past them is its steady state.
STARTUP_S = 30.0


def p99_past(requests, seconds):
    """The p99 latency (ms) of the requests ((arrival s, ms), a server's
    requests_at) that arrived `seconds` or more after the start (None: none
    did)."""
    return percentile([ms for at, ms in requests if at >= seconds], 99)


def giving_cost(runs):
    """What answering reclaims cost each job under allocd, on its own thread:
    the windows in which allocd held PyTorch's allocator (a reclaim's
    empty_cache), against the job's run; and, on the advisor's thread, the
    unmaps and gives of what went back."""
    rows = []
    for (part, n, mode), jobs in sorted(runs.items()):
        givers = [j for j in jobs if j.get("allocd", {}).get("reclaims")]
        if not givers:
            continue
        sessions = [j["allocd"] for j in givers]
        holds = [seconds * 1e3 for a in sessions
                 for _, seconds, _ in a.get("allocator_holds", {}).get("recent", [])]
        shares = [100 * sum(j["allocd"].get("allocator_holds", {}).get("seconds", {}).values())
                  / (j["cycles"] * j["jobs"] * j["slot_s"]) for j in givers]
        off_thread = [(a["map_path"].get("give_ns", 0) + a["map_path"].get("unmap_ns", 0)) / 1e6
                      for a in sessions if "map_path" in a]
        rows.append(f"| {part} | {n} | {mode} | {sum(a['reclaims'] for a in sessions)} | "
                    f"{len(holds)} | {fmt(percentile(holds, 50))} / {fmt(max(holds, default=None))} | "
                    f"{fmt(statistics.median(shares), '.4f')}% / {fmt(max(shares), '.4f')}% | "
                    f"{fmt(statistics.median(off_thread) if off_thread else None, '.1f')} |")
    if not rows:
        return
    print("\nWhat answering reclaims cost the jobs that gave memory back: allocd's holds of "
          "PyTorch's allocator on the job's side (p50 / max, ms), their total against the "
          "job's run (median / max of the jobs), and the unmaps and gives on the advisor's "
          "thread (ms per job, median):\n")
    print("| part | N | mode | reclaims answered | holds | hold p50 / max (ms) "
          "| held, of the run | advisor thread: unmap + give (ms) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


def server_segments(servers):
    """Under allocd, what each server mapped and what spares served: segments
    its empty_cache kept mapped through a reclaim, or pre-warmed
    (allocd.stats()'s map_path and spares)."""
    rows = [(key, server["allocd"]) for key, server in sorted(servers.items())
            if server.get("allocd", {}).get("map_path")]
    if not rows:
        return
    print("\nThe server's segments under allocd: mapped from a grant, or served by a spare "
          "(kept through a reclaim's partial give-back, or pre-warmed).\n")
    print("| server | mode | reclaims answered | segments mapped | spares taken | segments kept "
          "| partial give-backs | GiB they gave |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (part, mode), stats in rows:
        path, spares = stats["map_path"], stats.get("spares", {})
        print(f"| {part} | {mode} | {stats.get('reclaims', 0)} | {path['segments_mapped']} | "
              f"{path.get('spares_taken', '-')} | {path.get('segments_kept', '-')} | "
              f"{spares.get('partial_releases', '-')} | "
              f"{fmt(spares['bytes_given'] / 2**30 if 'bytes_given' in spares else None, '.1f')} |")


def into_cycle(server, at):
    """How far into its cycle (one slot a job) a request that arrived `at` s
    after the start came, in seconds."""
    return at % (server["jobs"] * server["slot_s"])


def phase(server, at):
    """Where in its cycle a request that arrived `at` s after the start came:
    the server's own batch (slot 0), the trainer's long steps (slot 1), or
    neither."""
    into = into_cycle(server, at)
    if into < server["hold_s"]:
        return "batch"
    if server["slot_s"] <= into < server["slot_s"] + server["hold_s"]:
        return "trainer"
    return "idle"


def slowest_requests(servers):
    """The slowest 1% of each server's requests (at least 8), by the phase of
    the cycle they arrived in, and those that waited while allocd held
    PyTorch's allocator (allocd.stats()'s allocator_holds)."""
    rows = [(key, server) for key, server in sorted(servers.items())
            if server.get("requests_at")]
    if not rows:
        return
    print("\nThe slowest 1% of the requests (at least 8): the phase of the cycle they "
          "arrived in, and how many waited on a hold of PyTorch's allocator by allocd "
          "(an empty_cache for a reclaim, a pre-warm's allocation).\n")
    print("| server | mode | requests | slower than (ms) | in the batch | in the trainer's slot "
          "| idle | during an allocd hold | holds (count, ms p50 / max) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for (part, mode), server in rows:
        requests = sorted(server["requests_at"], key=lambda r: -r[1])
        tail = requests[:max(8, math.ceil(len(requests) / 100))]
        holds = [(start - server["start"], seconds)
                 for start, seconds, _ in server.get("allocd", {})
                 .get("allocator_holds", {}).get("recent", [])]
        counts = collections.Counter(phase(server, at) for at, _ in tail)
        held = sum(1 for at, ms in tail
                   if any(start < at + ms / 1e3 and at < start + seconds
                          for start, seconds in holds))
        lengths = sorted(seconds * 1e3 for _, seconds in holds)
        summary = (f"{len(lengths)}, {percentile(lengths, 50):.1f} / {lengths[-1]:.1f}"
                   if lengths else "-")
        print(f"| {part} | {mode} | {len(requests)} | {tail[-1][1]:.2f} | {counts['batch']} | "
              f"{counts['trainer']} | {counts['idle']} | {held} | {summary} |")

# Windows of a cycle around the start of the trainer's slot, in seconds
# from it: where the reclaim's give-back and the trainer's gather land.
TRAINER_SLOT_WINDOWS = (("50 ms before", -0.05, 0.0), ("first 50 ms", 0.0, 0.05),
                        ("50-400 ms", 0.05, 0.4))


def trainer_slot_window(server, at):
    """The window of TRAINER_SLOT_WINDOWS a request that arrived `at` s after
    the start came in, else the rest of the trainer's slot or the server's."""
    since = into_cycle(server, at) - server["slot_s"]
    for name, start, end in TRAINER_SLOT_WINDOWS:
        if start <= since < end:
            return name
    return "rest of the trainer's slot" if 0 <= since < server["slot_s"] else "server's slot"


def by_trainer_slot(runs):
    """The servers beside a trainer: their requests' latency by when they
    arrived around the trainer's slot, p50 / p90 / max (ms)."""
    names = [name for name, _, _ in TRAINER_SLOT_WINDOWS] + [
        "rest of the trainer's slot", "server's slot"]
    print("| server | mode | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for (part, n, mode), jobs in sorted(runs.items()):
        server = next((j for j in jobs if j["kind"] == "server"), None)
        if server is None or n < 2 or not server.get("requests_at"):
            continue
        windows = collections.defaultdict(list)
        for at, ms in server["requests_at"]:
            windows[trainer_slot_window(server, at)].append(ms)
        cells = [" / ".join(fmt(percentile(windows[name], q)) for q in (50, 90, 100))
                 for name in names]
        print(f"| {part} | {mode} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
