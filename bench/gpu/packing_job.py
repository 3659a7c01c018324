"""One of N jobs packed onto one GPU (bench/gpu/packing.sh runs them).

Every job runs small training steps all the time (a bf16 MLP, forward and
backward, a few MiB allocated and freed each step) and, in its own slot of
each cycle, a peak: it takes --peak-gib in 2 GiB tensors, holds them for
--hold seconds while stepping, and frees them. Slots never overlap, so at
any moment only one job needs its peak; but a job's freed peak stays in its
PyTorch cache, so natively the cached peaks add up past the GPU.

  --schedule alternate   job i peaks in slot i of every cycle
  --schedule random      each cycle's slot order is a random permutation
                         (one seed for all jobs, so slots still never overlap)
  --kind trainer         a training job whose peak is long-batch steps (their
                         activations take about --peak-gib)
  --kind server          an inference server: requests arrive at --rate per
                         second (Poisson, seeded), each a KV cache of 1-4 GiB
                         and a few matmuls, timed from arrival to done; its
                         peak is one large batch whose KV cache is --peak-gib

Modes: native (PyTorch's allocator; PYTORCH_CUDA_ALLOC_CONF as the caller
set it), empty-cache (native, torch.cuda.empty_cache() after each peak),
fraction (native, torch.cuda.set_per_process_memory_fraction(1/N): static
partitioning), transparent (allocd.enable(): PyTorch's allocator on the
daemon's memory). `allocd run -- python packing_job.py --mode native` is the
unchanged script.

Prints and writes one JSON: OOMs (peaks and steps), step times (CUDA events,
warm-up excluded), each peak's gather time (from its first allocation to
the last one done, synchronized), requests' latencies (server: each with its
arrival, so that the slowest can be laid beside the cycle's phases and
allocd.stats()'s allocator_holds). Under allocd,
where each peak's gather time went (allocd.stats()'s map_path, read before
and after it): the daemon's round trips for the chunks (a reclaim from the
neighbours waits in them), importing and mapping them, enabling access.
"""
import argparse
import json
import math
import os
import random
import sys
import time

PIECE = 2 << 30


def parse():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="N, the jobs sharing the GPU")
    p.add_argument("--kind", choices=["peaks", "server", "trainer"], default="peaks")
    p.add_argument("--schedule", choices=["alternate", "random"], default="alternate")
    p.add_argument("--mode", choices=["native", "empty-cache", "fraction", "transparent"],
                   required=True)
    p.add_argument("--no-stream", action="store_true",
                   help="transparent: send the daemon no allocation stream (record_events=False; "
                        "nothing to autotune on)")
    p.add_argument("--socket", default=os.environ.get("ALLOCD_SOCKET", "/run/allocd/allocd.sock"))
    p.add_argument("--peak-gib", type=float, default=40)
    p.add_argument("--slot", type=float, default=1.0, help="seconds per slot")
    p.add_argument("--hold", type=float, default=0.6, help="seconds a peak is held")
    p.add_argument("--cycles", type=int, default=4)
    p.add_argument("--start", type=float, help="time.time() of cycle 0")
    p.add_argument("--start-file",
                   help="instead of --start: once ready, write PATH.ready, then wait for PATH "
                        "and read the start from it (every job of a run starts at once)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=int, default=1024, help="the step's MLP width")
    p.add_argument("--batch", type=int, default=512, help="the step's batch")
    p.add_argument("--step-gap", type=float, default=0.002,
                   help="seconds between steps (jobs that share a GPU leave it room)")
    p.add_argument("--rate", type=float, default=20, help="server: requests per second")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of steps left out")
    p.add_argument("--json")
    return p.parse_args()


def is_oom(error):
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def map_path():
    """allocd's map-path counters (None when not under allocd)."""
    if "allocd" not in sys.modules:
        return None
    return sys.modules["allocd"].stats().get("map_path")


class Job:
    def __init__(self, torch, a):
        self.torch, self.a = torch, a
        self.ooms, self.step_ooms = 0, 0
        self.steps, self.gathers, self.latencies, self.notes = [], [], [], []
        self.requests_at = []  # (arrival after the start, latency), seconds
        self.gather_paths = []  # per gather: where its time went under allocd
        torch.manual_seed(a.seed + a.index)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(a.width, 4 * a.width), torch.nn.GELU(),
            torch.nn.Linear(4 * a.width, a.width)).cuda().to(torch.bfloat16)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)

    def note(self, text):
        if len(self.notes) < 8:
            self.notes.append(text[:240])
            print(f"job {self.a.index}: {text[:240]}", flush=True)

    def step(self, batch, timed=True):
        """One training step, timed with CUDA events (`timed`: its time is
        a step's, not a peak's); an OOM counts."""
        torch = self.torch
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        wall = time.time()
        begin.record()
        try:
            x = torch.randn(batch, self.a.width, device="cuda", dtype=torch.bfloat16)
            self.model(x).float().pow(2).mean().backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        except RuntimeError as error:
            if not is_oom(error):
                raise
            self.step_ooms += 1
            self.note(f"step at batch {batch}: {str(error).splitlines()[0]}")
            return
        end.record()
        end.synchronize()
        if timed and self.a.start is not None and wall - self.a.start >= self.a.warmup:
            self.steps.append(begin.elapsed_time(end) / 1000)

    def gather(self, gib):
        """Takes a peak of `gib` in 2 GiB tensors; returns them (None: OOM)."""
        torch = self.torch
        held = []
        before = map_path()
        t = time.monotonic()
        try:
            for _ in range(max(1, int(gib * (1 << 30) // PIECE))):
                held.append(torch.empty(PIECE, dtype=torch.uint8, device="cuda"))
            torch.cuda.synchronize()
        except RuntimeError as error:
            if not is_oom(error):
                raise
            self.ooms += 1
            self.note(f"peak of {gib:g} GiB: {str(error).splitlines()[0]}")
            return None
        self.gathers.append(time.monotonic() - t)
        after = map_path()
        if before is not None and after is not None:
            # The counters (not the log of large segments) over the gather.
            self.gather_paths.append({k: after[k] - before[k] for k in after
                                      if isinstance(after[k], int)})
        return held

    def release(self, held):
        held.clear()
        if self.a.mode == "empty-cache":
            self.torch.cuda.empty_cache()

    def background_until(self, deadline):
        """What the job does outside its peak: training steps, or (server)
        the requests that arrived by now."""
        while time.time() < deadline:
            if self.a.kind != "server":
                self.step(self.a.batch)
                time.sleep(self.a.step_gap)
                continue
            if self.arrivals and self.arrivals[0] <= time.time():
                self.serve(self.arrivals.pop(0), self.rng.choice([1, 2, 4]), timed=True)
            else:
                time.sleep(0.0002)

    def serve(self, arrival, cache_gib, timed):
        """One request: a KV cache of `cache_gib` and a few matmuls."""
        torch, a = self.torch, self.a
        try:
            kv = torch.empty(int(cache_gib * (1 << 30)) // 2, dtype=torch.bfloat16, device="cuda")
            x = kv[: 64 * a.width].view(64, a.width)
            for _ in range(4):
                x = self.model[0](x)[:, : a.width]
            torch.cuda.synchronize()
            del kv, x
        except RuntimeError as error:
            if not is_oom(error):
                raise
            self.ooms += 1
            self.note(f"request of {cache_gib:g} GiB: {str(error).splitlines()[0]}")
            return False
        if timed and arrival - a.start >= a.warmup:
            self.latencies.append(time.time() - arrival)
            self.requests_at.append((arrival - a.start, self.latencies[-1]))
        if a.mode == "empty-cache":
            torch.cuda.empty_cache()
        return True

    def peak(self, until):
        """This job's peak, from now until `until`."""
        a = self.a
        if a.kind == "peaks":
            held = self.gather(a.peak_gib)
            if held is not None:
                self.background_until(until)
                self.release(held)
        elif a.kind == "server":  # one large batch: its KV cache is the peak
            t = time.monotonic()
            if self.serve(time.time(), a.peak_gib, timed=False):
                self.gathers.append(time.monotonic() - t)
            self.background_until(until)
        else:  # trainer: long-batch steps; their activations are the peak
            while time.time() < until:
                t = time.monotonic()
                before = self.step_ooms
                self.step(self.long_batch, timed=False)
                if self.step_ooms == before:
                    self.gathers.append(time.monotonic() - t)
                else:  # the peak's OOM, not a step's
                    self.step_ooms, self.ooms = before, self.ooms + 1
            if a.mode == "empty-cache":
                self.torch.cuda.empty_cache()

    def run(self):
        a = self.a
        cycle = a.jobs * a.slot
        # About 42 bytes of activations and their gradients per sample and
        # unit of width in the step's MLP: the long batch that makes the peak.
        self.long_batch = max(a.batch, int(a.peak_gib * (1 << 30) / (42 * a.width)))
        self.rng = random.Random(a.seed + 7)
        self.arrivals, t = [], a.start
        while a.kind == "server" and t < a.start + a.cycles * cycle:
            t += self.rng.expovariate(a.rate)
            self.arrivals.append(t)
        for c in range(a.cycles):
            order = list(range(a.jobs))
            if a.schedule == "random":
                random.Random(a.seed * 1000 + c).shuffle(order)
            slot_start = a.start + c * cycle + order.index(a.index) * a.slot
            self.background_until(slot_start)
            self.peak(slot_start + a.hold)
        self.background_until(a.start + a.cycles * cycle)


def percentile(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def main():
    a = parse()
    if (a.start is None) == (a.start_file is None):
        sys.exit("packing_job.py: give one of --start and --start-file")
    if a.mode == "transparent":
        import allocd
        allocd.enable(socket=a.socket, job=f"pack-{a.kind}-{a.index}", required=True,
                      mode="transparent", record_events=not a.no_stream)
    import torch
    torch.cuda.init()
    if a.mode == "fraction":
        torch.cuda.set_per_process_memory_fraction(1.0 / a.jobs)
    job = Job(torch, a)
    job.step(a.batch)  # CUDA's and cuBLAS's first use, before the clock starts
    torch.cuda.synchronize()
    if a.start_file:
        open(f"{a.start_file}.ready.{a.index}", "w").close()
        while not os.path.exists(a.start_file):
            time.sleep(0.005)
        time.sleep(0.01)
        a.start = float(open(a.start_file).read())
    while time.time() < a.start - 0.5:
        time.sleep(0.01)
    job.run()
    torch.cuda.synchronize()
    result = {
        "index": a.index, "jobs": a.jobs, "kind": a.kind, "schedule": a.schedule,
        "mode": a.mode, "stream": not a.no_stream, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "under_allocd_run": os.environ.get("ALLOCD_AUTOSTART") == "1",
        # A client of packing.sh's MPS control daemon (MPS=1), at this
        # priority, on at most this percentage of the SMs.
        "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
        "mps_client_priority": int(os.environ.get("CUDA_MPS_CLIENT_PRIORITY") or 0),
        "mps_active_thread_percentage": int(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
                                            or 100),
        "peak_gib": a.peak_gib, "cycles": a.cycles, "slot_s": a.slot, "hold_s": a.hold,
        "start": a.start,
        "ooms": job.ooms, "step_ooms": job.step_ooms,
        "peaks_held": len(job.gathers),
        "steps": len(job.steps),
        "step_ms_p50": (percentile(job.steps, 50) or 0) * 1e3,
        "step_ms_p99": (percentile(job.steps, 99) or 0) * 1e3,
        "step_ms_mean": sum(job.steps) / len(job.steps) * 1e3 if job.steps else None,
        "gather_s": [round(g, 4) for g in job.gathers],
        "gather_paths": job.gather_paths,
        "requests": len(job.latencies),
        "latency_ms_p50": (percentile(job.latencies, 50) or 0) * 1e3,
        "latency_ms_p99": (percentile(job.latencies, 99) or 0) * 1e3,
        # Each request: [arrival, seconds after the start; latency, ms].
        "requests_at": [[round(at, 4), round(lat * 1e3, 3)] for at, lat in job.requests_at],
        "max_reserved_gib": torch.cuda.max_memory_reserved() / (1 << 30),
        "notes": job.notes,
    }
    if a.mode == "transparent":
        import allocd
        try:
            result["allocd"] = allocd.stats()
        except Exception as error:  # noqa: BLE001
            result["allocd"] = {"error": str(error)}
    print(json.dumps(result)[:600], flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
