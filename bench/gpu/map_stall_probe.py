"""Whether mapping and unmapping GPU memory (CUDA VMM, as allocd's client
does on a reclaim and a gather) stalls a neighbour's short requests, and
whether doing it in pieces with pauses between lets them through.

    python map_stall_probe.py [--gib 60] [--chunk-gib 1] [--pieces 1]
        [--gap-ms 0] [--cycles 20] [--mover thread|process|none]

A victim (this process's main thread) serves requests back to back, as
packing_job.py's server does: four matmuls of a 64-row batch and a
synchronize each. A mover, on a thread of this process (what a job's own
give-back is) or in another process (what a neighbour's gather is), every
0.5 s maps --gib GiB in chunks of --chunk-gib (cuMemCreate, cuMemMap, one
cuMemSetAccess a piece), holds it 0.25 s, and unmaps it (a context
synchronize first, as allocd's client does, then cuMemUnmap and
cuMemRelease of each chunk); each of these in --pieces pieces with --gap-ms
between them. Prints one JSON line: the requests' latency p50/p99/max
while mapping, while unmapping and otherwise, and the phases' durations.
"""
import argparse
import ctypes
import json
import subprocess
import sys
import threading
import time

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


def check(result, what):
    if result != 0:
        raise RuntimeError(f"{what}: CUresult {result}")


class Mover:
    def __init__(self, a):
        self.a = a
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.prop = Prop(type=CU_MEM_ALLOCATION_TYPE_PINNED,
                         location=Location(CU_MEM_LOCATION_TYPE_DEVICE, 0))
        self.chunk = int(a.chunk_gib * (1 << 30))
        self.count = int(a.gib / a.chunk_gib)
        self.base = ctypes.c_uint64()
        check(self.cu.cuMemAddressReserve(ctypes.byref(self.base), ctypes.c_size_t(self.chunk * self.count),
                                          ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_uint64(0)),
              "cuMemAddressReserve")
        self.phases = []  # (kind, start, end)

    def pieces(self):
        per = max(1, -(-self.count // self.a.pieces))
        return [range(i, min(i + per, self.count)) for i in range(0, self.count, per)]

    def map(self):
        handles = []
        for piece in self.pieces():
            for i in piece:
                h = ctypes.c_uint64()
                check(self.cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(self.chunk),
                                          ctypes.byref(self.prop), ctypes.c_uint64(0)), "cuMemCreate")
                check(self.cu.cuMemMap(ctypes.c_uint64(self.base.value + i * self.chunk),
                                       ctypes.c_size_t(self.chunk), ctypes.c_size_t(0), h,
                                       ctypes.c_uint64(0)), "cuMemMap")
                handles.append(h)
            desc = AccessDesc(Location(CU_MEM_LOCATION_TYPE_DEVICE, 0),
                              CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            check(self.cu.cuMemSetAccess(ctypes.c_uint64(self.base.value + piece[0] * self.chunk),
                                         ctypes.c_size_t(len(piece) * self.chunk),
                                         ctypes.byref(desc), ctypes.c_size_t(1)), "cuMemSetAccess")
            time.sleep(self.a.gap_ms / 1e3)
        return handles

    def unmap(self, handles):
        check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")
        for piece in self.pieces():
            for i in piece:
                check(self.cu.cuMemUnmap(ctypes.c_uint64(self.base.value + i * self.chunk),
                                         ctypes.c_size_t(self.chunk)), "cuMemUnmap")
                check(self.cu.cuMemRelease(handles[i]), "cuMemRelease")
            time.sleep(self.a.gap_ms / 1e3)

    def run(self, until, on_thread=False):
        if on_thread:  # the process's context made current on this thread
            context = ctypes.c_void_p()
            check(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0), "cuDevicePrimaryCtxRetain")
            check(self.cu.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        while time.time() < until:
            time.sleep(0.5)
            start = time.time()
            handles = self.map()
            mapped = time.time()
            self.phases.append(("map", start, mapped))
            time.sleep(0.25)
            start = time.time()
            self.unmap(handles)
            self.phases.append(("unmap", start, time.time()))


def percentiles(values):
    if not values:
        return None
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]
    return {"n": len(values), "p50": round(pick(0.5), 3), "p99": round(pick(0.99), 3),
            "max": round(values[-1], 3)}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, default=60)
    p.add_argument("--chunk-gib", type=float, default=1)
    p.add_argument("--pieces", type=int, default=1)
    p.add_argument("--gap-ms", type=float, default=0)
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--mover", choices=["thread", "process", "none"], default="thread")
    p.add_argument("--role", choices=["victim", "mover"], default="victim")
    p.add_argument("--until", type=float, default=0)
    a = p.parse_args()
    import torch
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    if a.role == "mover":
        mover = Mover(a)
        mover.run(a.until)
        print(json.dumps(mover.phases))
        return
    width = 8192
    weight = torch.randn(width, width, device="cuda", dtype=torch.bfloat16)
    x0 = torch.randn(64, width, device="cuda", dtype=torch.bfloat16)
    for _ in range(50):
        (x0 @ weight).sum().item()
    until = time.time() + a.cycles * 0.75 + 1
    mover, proc = None, None
    if a.mover == "thread":
        mover = Mover(a)
        threading.Thread(target=mover.run, args=(until, True), daemon=True).start()
    elif a.mover == "process":
        proc = subprocess.Popen([sys.executable, __file__, "--role", "mover", "--until", str(until)]
                                + [f"--{k.replace('_', '-')}={getattr(a, k)}"
                                   for k in ("gib", "chunk_gib", "pieces", "gap_ms")],
                                stdout=subprocess.PIPE, text=True)
    requests = []
    while time.time() < until:
        start = time.time()
        x = x0
        for _ in range(4):
            x = x @ weight
        torch.cuda.synchronize()
        requests.append((start, (time.time() - start) * 1e3))
        time.sleep(0.001)
    phases = mover.phases if mover else []
    if proc is not None:
        phases = json.loads(proc.communicate()[0].strip().splitlines()[-1])
    by = {"map": [], "unmap": [], "other": []}
    for start, ms in requests:
        end = start + ms / 1e3
        kind = next((k for k, s, e in phases if start < e and end > s), "other")
        by[kind].append(ms)
    durations = {k: percentiles([(e - s) * 1e3 for kk, s, e in phases if kk == k])
                 for k in ("map", "unmap")}
    print(json.dumps({"gib": a.gib, "chunk_gib": a.chunk_gib, "pieces": a.pieces,
                      "gap_ms": a.gap_ms, "mover": a.mover,
                      "latency_ms": {k: percentiles(v) for k, v in by.items()},
                      "phase_ms": durations}), flush=True)


if __name__ == "__main__":
    main()
