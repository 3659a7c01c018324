"""A worker of bench/gpu/overhead.py: one fixed-shape workload in one mode,
kept warm in this process and timed in rounds on request, so that the
rounds of every mode interleave without each paying Python's and CUDA's
start-up.

    python overhead_job.py --workload seq2seq|resnet50|generate|churn|resnet50-graph
        --mode native|transparent|advise [--warmup 10]

Workloads (fixed shapes, so every step allocates alike):
  seq2seq   a T5-base-shaped fine-tune (randomly initialised), batch 16,
            source 256 and target 128 tokens, bf16 autocast, AdamW
  resnet50  torchvision's ResNet-50, channels_last, batch 64 at 224x224,
            bf16 autocast, SGD with momentum
  generate  a GPT-2-medium-shaped model (fp16), batch 16, 128-token prompts,
            16 new tokens, greedy (one generate() call a step)
  churn     no model: 10,000 tensors allocated and freed a step (the
            allocator's path alone, what allocd adds to each event)
  resnet50-graph  resnet50's step captured in a CUDA graph and replayed: the
            GPU's time alone, one launch a step and no allocation, so that
            where the step's memory lives is all a mode can change
Modes: native; transparent (allocd.enable() before torch); advise
(allocd.advise(): PyTorch's own allocator, its history streamed). Parts of
allocd alone: loaded (its client and tracker libraries loaded, nothing
started), loaded-first (the client library loaded before torch, where
enable() loads the interposer, with its symbols global; nothing started),
tracked (the tracker attached to PyTorch's allocator, its events taken
between turns; no thread, no daemon) and attached (the tracker
attached and stopped: what PyTorch does for a tracker, without ours). `allocd
run -- python overhead_job.py --mode native` is the unchanged script.

It runs --warmup steps, prints {"ready": ...}, then for each line "N [U]" on
its standard input runs U untimed steps (default 1) and N timed ones and
prints one JSON line with every timed step ("profile N PATH": N steps under PyTorch's
profiler, its table of the top operators by self CPU time written to PATH;
"cpuprofile N PATH": N steps under gperftools' sampling profiler, the
library $ALLOCD_LIBPROFILER names, every thread's native stacks written to
PATH for cpu_profile_top.py; "syscalls N PATH": N steps with the job
thread's system calls counted by strace -c, $ALLOCD_STRACE or the strace on
PATH, its table written to PATH for syscall_counts.py).
Each step is timed twice: CUDA events around it (the GPU's view, launch
gaps included), and the host's clock from before it to after its
synchronize (what the job waits). With each turn it reports the CPU time
each of its threads ran during the timed steps (/proc's schedstat, in ns),
summed by name: the job's own thread, allocd's threads (named "allocd-*",
the C++ client's and the Python advisor's), and the rest (PyTorch's, CUDA's,
gRPC's): where allocd's work runs beside the job's, and the advisor's rounds
in the turn with their seconds by part (allocd.stats()), and the
instructions each thread group retired in the timed steps (the CPU's
counters, where it has them: the work, at any core speed), and the steal
time the hypervisor took from the guest's CPUs meanwhile. And the host's speed
around the turn: a fixed pure-CPU loop timed on the job's thread right
before and right after it (probe_ms). Steps that wait on the CPU's launches
run as fast as the core does, and the cores of a cloud host change speed by
tens of percent from one second to the next: overhead.py compares a mode's
turn with native's only where the probes say the core ran alike.

--job-core C pins the job's own thread to core C once warm (the threads it
started before, PyTorch's, CUDA's and allocd's, keep every core it had), so
that every mode's job thread runs on the one core native's ran on.
--autograd-core C does the same for PyTorch's autograd threads, which launch
a training step's backward: left to the scheduler, each worker's settles on
a core of its own, and on a host whose cores differ in speed that places a
bias on its worker for the whole run.
"""
import argparse
import contextlib
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time


def build(torch, workload):
    if workload == "seq2seq":
        from transformers import T5Config, T5ForConditionalGeneration
        cfg = T5Config(d_model=768, d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12,
                       vocab_size=32128, decoder_start_token_id=0, pad_token_id=0)
        model = T5ForConditionalGeneration(cfg).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, cfg.vocab_size, (16, 256), device="cuda")
        labels = torch.randint(0, cfg.vocab_size, (16, 128), device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    if workload == "resnet50":
        import torchvision
        model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(64, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (64,), device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    if workload == "resnet50-graph":
        step = build(torch, "resnet50")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return graph.replay
    if workload == "churn":
        # The allocator's path alone: 10,000 tensors of 512 B to 2 MiB a step,
        # each freed 64 allocations later (30,000 events a step).
        sizes = [512 << (i % 13) for i in range(97)]

        def step():
            live = [None] * 64
            for i in range(CHURN_ALLOCATIONS):
                live[i % 64] = torch.empty(sizes[i % len(sizes)], dtype=torch.uint8,
                                           device="cuda")
            live.clear()
        return step
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_embd=1024, n_layer=24, n_head=16, vocab_size=50257, n_positions=1024)
    model = GPT2LMHeadModel(cfg).to(torch.float16).cuda().eval()
    ids = torch.randint(0, cfg.vocab_size, (16, 128), device="cuda")
    mask = torch.ones_like(ids)

    def step():
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=16, min_new_tokens=16,
                           do_sample=False, pad_token_id=0)
    return step


CHURN_ALLOCATIONS = 10_000
PROBE_ITERATIONS = 300_000  # about 5 ms of the interpreter's loop


def probe_ms():
    """The wall time of a fixed loop of Python bytecode on this thread: how
    fast its core runs now (the launch path is the interpreter's and
    PyTorch's dispatcher, CPU work alike)."""
    start = time.perf_counter()
    total = 0
    for i in range(PROBE_ITERATIONS):
        total += i
    return (time.perf_counter() - start) * 1e3


def host_steal_ticks():
    """The host's steal time so far, in USER_HZ ticks summed over every CPU
    (/proc/stat): time this guest's vCPUs were ready to run and the
    hypervisor ran something else."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8])
    except (OSError, ValueError, IndexError):
        return None


def job_thread_counters(cores):
    """What the kernel counts of the job's own thread, to tell where extra CPU
    time goes when no function of its own shows it: page faults, user and
    system ticks (/proc/.../stat), run-queue wait and time slices
    (schedstat), voluntary and forced context switches (status), and the
    interrupts the job's and autograd's cores took by kind ("irq:TLB" is TLB
    shootdowns: another thread of the process changed its mappings).
    Absent counters are left out."""
    task = f"/proc/self/task/{threading.main_thread().native_id}"
    out = {}
    try:
        with open(f"{task}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # After the comm: state is fields[0], minflt [7], majflt [9], utime [11], stime [12].
        out.update(minflt=int(fields[7]), majflt=int(fields[9]),
                   utime_ticks=int(fields[11]), stime_ticks=int(fields[12]))
        with open(f"{task}/schedstat") as f:
            _, wait_ns, slices = (int(x) for x in f.read().split()[:3])
        out.update(runqueue_wait_ns=wait_ns, slices=slices)
        with open(f"{task}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                    out[key] = int(value)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/interrupts") as f:
            cpus = f.readline().split()
            columns = [cpus.index(f"CPU{c}") for c in cores if f"CPU{c}" in cpus]
            for line in f:
                name, _, counts = line.partition(":")
                counts = counts.split()
                if name.strip().isdigit() or len(counts) < len(cpus):
                    continue
                out[f"irq:{name.strip()}"] = sum(int(counts[i]) for i in columns)
    except (OSError, ValueError, IndexError):
        pass
    return out


@contextlib.contextmanager
def syscalls_counted(path):
    """Counts the calling thread's system calls while the block runs: strace
    -c attached to this thread alone writes their number and the system time
    in each to `path`. Every call it sees stops twice for the tracer, so the
    counts are the measure, not the block's time."""
    # Yama's ptrace scope 1 lets a process trace only its descendants unless
    # the traced one names its tracer: here a child traces its parent.
    PR_SET_PTRACER, PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1)
    ctypes.CDLL(None).prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0)
    tracer = subprocess.Popen(
        [os.environ.get("ALLOCD_STRACE", "strace"), "-c", "-o", path,
         "-p", str(threading.get_native_id())], stderr=subprocess.PIPE, text=True)
    said = tracer.stderr.readline()  # "strace: Process TID attached"
    if "attached" not in said:
        tracer.kill()
        tracer.wait()
        raise RuntimeError(f"strace did not attach: {said.strip() or tracer.stderr.read()}")
    try:
        yield
    finally:
        tracer.send_signal(signal.SIGINT)  # detaches and writes the table
        tracer.communicate(timeout=60)


def advisor_counters():
    """The advisor's rounds and seconds by part so far (allocd.stats()), or None
    where no advisor runs in this process."""
    allocd = sys.modules.get("allocd")
    if allocd is None:
        return None
    info = allocd.stats()
    if "advisor_rounds" not in info:
        return None
    return {"rounds": info["advisor_rounds"], **info["advisor_seconds_by_part"]}


def switch_advisor_off(parts):
    """Switches `parts` of the running advisor off (--advisor-off): "hook", its
    step hook on the job's thread; "rounds", its rounds (one more, then the
    next an hour later)."""
    import allocd
    advisor = allocd._state.advisor
    unknown = set(parts) - {"hook", "rounds"}
    if advisor is None or unknown:
        sys.exit(f"--advisor-off {','.join(parts)}: needs advise mode and parts among hook, rounds")
    if "hook" in parts and advisor._step_hook is not None:
        advisor._step_hook.remove()
        advisor._step_hook = None
    if "rounds" in parts:
        advisor._period = 3600.0
        advisor._wake.set()


def counters_between(before, after):
    if before is None or after is None:
        return None
    return {k: after[k] - before[k] for k in after}


def thread_names():
    """Native thread id -> name: Python's names for its threads (the
    advisor's), else the system's (allocd's C++ threads name themselves)."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id}
    main_id = threading.main_thread().native_id
    out = {}
    for tid in os.listdir("/proc/self/task"):
        tid = int(tid)
        if tid == main_id:
            out[tid] = "job"
            continue
        name = names.get(tid)
        if name is None:
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    name = f.read().strip()
            except OSError:
                continue
        out[tid] = name
    return out


def thread_cpu_ns():
    """Native thread id -> CPU time it has run, in ns."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return out


def by_group(before, after, unit):
    """What each thread counted between two readings (tid -> count), over
    `unit`, summed by thread group: the job's, allocd's by name, the rest
    ("other:NAME", by the system's name, a pool's numbered threads as one)."""
    names = thread_names()
    groups = {}
    for tid, count in after.items():
        name = names.get(tid, "?")
        # Threads of a kind together (a pool's numbered threads as one).
        group = name if name == "job" or name.startswith("allocd") else \
            "other:" + name.rstrip("0123456789_-")
        groups[group] = groups.get(group, 0.0) + (count - before.get(tid, 0)) / unit
    return groups


class InstructionCounters:
    """The instructions each of this process's threads retires, from the
    CPU's own counters (perf_event_open): the work a step does, whatever
    speed the core runs at. User and kernel where the system lets this
    process count the kernel's, else user only (`scope`). available is False
    where there are no counters (a VM without them, a seccomp filter)."""

    _SYSCALL = {"x86_64": 298, "aarch64": 241}
    _EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 5, 1 << 6

    def __init__(self):
        import ctypes
        import platform
        self._ctypes = ctypes
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._number = self._SYSCALL.get(platform.machine())
        self.scope = None
        for scope, flags in (("user+kernel", self._EXCLUDE_HV),
                             ("user", self._EXCLUDE_KERNEL | self._EXCLUDE_HV)):
            fd = self._open(threading.get_native_id(), flags)
            if fd >= 0:
                os.close(fd)
                self.scope, self._flags = scope, flags
                break
        self.available = self.scope is not None
        self._fds = {}

    def _open(self, tid, flags):
        if self._number is None:
            return -1
        # struct perf_event_attr, its first 64 bytes (PERF_ATTR_SIZE_VER0):
        # PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, counting from open.
        attr = (self._ctypes.c_uint64 * 8)()
        attr[0] = 0 | (64 << 32)  # type, size
        attr[1] = 1  # config
        attr[6] = flags
        return self._libc.syscall(self._number, attr, tid, -1, -1, 0)

    def start(self):
        """Opens a counter on every thread now alive."""
        self.stop()
        for tid in os.listdir("/proc/self/task"):
            fd = self._open(int(tid), self._flags)
            if fd >= 0:
                self._fds[int(tid)] = fd

    def read(self):
        """tid -> instructions since start()."""
        return {tid: int.from_bytes(os.read(fd, 8), "little") for tid, fd in self._fds.items()}

    def stop(self):
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}


def reserve_address_space(mib):
    """Reserves `mib` MiB of address space (no memory): the libraries loaded
    after it land that much lower."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    PROT_NONE, MAP_PRIVATE, MAP_ANONYMOUS, MAP_NORESERVE = 0, 0x02, 0x20, 0x4000
    if libc.mmap(None, mib << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0) in (None, ctypes.c_void_p(-1).value):
        sys.exit(f"--pad-mib: mmap failed (errno {ctypes.get_errno()})")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", required=True,
                   choices=["seq2seq", "resnet50", "generate", "churn", "resnet50-graph"])
    p.add_argument("--mode", required=True,
                   choices=["native", "transparent", "advise", "loaded", "loaded-first", "tracked",
                            "attached"])
    p.add_argument("--job", default=None,
                   help="the job label allocd knows it by (default: overhead-WORKLOAD)")
    p.add_argument("--socket", default=os.environ.get("ALLOCD_SOCKET", "/run/allocd/allocd.sock"))
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--job-core", type=int, default=None,
                   help="once warm, pin the job's own thread to this core")
    p.add_argument("--autograd-core", type=int, default=None,
                   help="once warm, pin PyTorch's autograd threads to this core")
    p.add_argument("--until-paused", type=float, default=0, metavar="S",
                   help="once warm, step (up to S seconds) until the daemon has paused the "
                        "allocation stream (its first pass settled the job's config)")
    p.add_argument("--pad-mib", type=int, default=0,
                   help="before allocd and torch load, reserve this many MiB of address space "
                        "(no memory): every library loaded after it lands that much lower, "
                        "what a mode's own libraries do to torch's, without them")
    p.add_argument("--pad-after-allocd", action="store_true",
                   help="reserve it after allocd loads (enable()) and before torch does: "
                        "torch's libraries move, allocd's stay")
    p.add_argument("--learned-lookup", choices=["as-is", "skip", "here"], default="as-is",
                   help="the daemon asked for the job's learned config before torch loads: "
                        "as the mode asks it (as-is: enable() in a process of its own), "
                        "never (skip), or in this process first, whatever the mode (here: "
                        "gRPC starts in the job's process before torch, as enable() asked "
                        "it until it asked from another process)")
    p.add_argument("--advisor-off", default="", metavar="PARTS",
                   help="advise mode: once ready, switch these parts of the advisor off "
                        "(comma-separated: hook, its step hook on the job's thread; rounds, "
                        "its rounds, then an hour apart): what each costs the job")
    a = p.parse_args()
    job = a.job or f"overhead-{a.workload}"
    if a.pad_mib and not a.pad_after_allocd:
        reserve_address_space(a.pad_mib)
    if a.mode == "loaded-first":
        # allocd's client library and its dependencies loaded where enable()
        # loads the interposer (before torch, with its symbols global), and
        # nothing started: whatever loading them there does to torch's step.
        from allocd import _bindings
        _bindings.load_client(mode=ctypes.RTLD_GLOBAL)
    if a.learned_lookup != "as-is":
        from allocd import _bindings, _transparent
        if a.learned_lookup == "here":
            learned = ctypes.create_string_buffer(4096)
            library = _bindings.library_path(_bindings.INTERPOSE_LIBRARY) \
                if a.mode == "transparent" else None  # else the client library
            _bindings.load_client(library, mode=ctypes.RTLD_GLOBAL).allocd_start_on_learned_config(
                a.socket.encode(), job.encode(), learned, len(learned))
        _transparent.start_on_learned_config = lambda *_: None  # enable() asks no more
    if a.mode == "transparent":
        import allocd
        allocd.enable(socket=a.socket, job=job, required=True, mode="transparent")
    if a.pad_mib and a.pad_after_allocd:
        reserve_address_space(a.pad_mib)
    import torch
    if a.mode == "advise":
        import allocd
        allocd.advise(socket=a.socket, job=job, required=True)
    tracker = None
    if a.mode in ("loaded", "tracked", "attached"):
        # Apart from every thread and round trip of allocd's: its libraries
        # in the process (loaded), and with them the allocation tracker in
        # PyTorch's allocator (tracked; its events taken between turns).
        from allocd import _bindings, _tracker
        _bindings.load_client()
        tracker = _tracker.TrackerReader.for_torch(torch, 0)
        if a.mode in ("tracked", "attached"):
            tracker.start()
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    step = build(torch, a.workload)
    under_run = os.environ.get("ALLOCD_AUTOSTART") == "1"

    def timed(n):
        gpu, host = [], []
        for _ in range(n):
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t = time.perf_counter()
            begin.record()
            step()
            end.record()
            end.synchronize()
            host.append(time.perf_counter() - t)
            gpu.append(begin.elapsed_time(end) / 1000)
        return gpu, host

    timed(a.warmup)
    if a.mode == "attached":
        tracker.stop()  # attached (CUDA is up), its events ignored: PyTorch's part alone
    counters = InstructionCounters()
    job_cores = [c for c in (a.job_core, a.autograd_core) if c is not None]
    if a.job_core is not None:
        os.sched_setaffinity(threading.get_native_id(), {a.job_core})
    if a.autograd_core is not None:
        for tid, name in thread_names().items():
            if name.startswith("pt_autograd"):
                os.sched_setaffinity(tid, {a.autograd_core})
    source = read_in = None
    if a.mode in ("transparent", "advise") or under_run:
        import allocd
        # Under `allocd run` the session starts on a thread of its own once
        # PyTorch first asks for memory: a fast workload's warm-up can end
        # before it, and its first timed steps would then run without allocd.
        deadline = time.monotonic() + 60
        while not allocd.stats().get("connected") and time.monotonic() < deadline:
            time.sleep(0.05)
        source = allocd.stats().get("event_source")
        read_in = allocd.stats().get("history_read_in")
    # The steps a first run streams before its stream pauses, and their mean.
    paused = {}
    if a.until_paused and source is not None:
        deadline, steps, spent = time.monotonic() + a.until_paused, 0, 0.0
        while allocd.stats().get("event_source") != "deferred" and time.monotonic() < deadline:
            spent += sum(timed(1)[1])
            steps += 1
        stats = allocd.stats()
        source = stats.get("event_source")
        paused = {"steps_until_paused": steps, "mean_step_s_until_paused": spent / max(1, steps),
                  "stream_paused": stats.get("stream_paused"),
                  "events_sent": stats.get("events_sent")}
    if a.advisor_off:
        switch_advisor_off(a.advisor_off.split(","))
    print(json.dumps({"ready": a.mode, "under_allocd_run": under_run, "event_source": source,
                      "history_read_in": read_in, **paused}), flush=True)
    for line in sys.stdin:
        if line.startswith("profile "):  # profile N PATH: N steps under PyTorch's profiler
            _, n, path = line.split()
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                timed(int(n))
            with open(path, "w") as f:
                f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
            print(json.dumps({"profiled": path}), flush=True)
            continue
        if line.startswith("cpuprofile "):  # cpuprofile N PATH: N steps under gperftools'
            _, n, path = line.split()       # sampling profiler ($ALLOCD_LIBPROFILER)
            profiler = ctypes.CDLL(os.environ["ALLOCD_LIBPROFILER"])
            profiler.ProfilerStart(path.encode())
            timed(int(n))
            profiler.ProfilerStop()
            print(json.dumps({"cpu_profiled": path, "steps": int(n)}), flush=True)
            continue
        if line.startswith("syscalls "):  # syscalls N PATH: syscalls_counted
            _, n, path = line.split()
            with syscalls_counted(path):
                timed(int(n))
            print(json.dumps({"syscalls_counted": path, "steps": int(n)}), flush=True)
            continue
        # The untimed first step of a turn (the switch between workers) is
        # where a due allocator-state read falls, every ALLOCD_STATE_PERIOD_S:
        # allocd's counters take it in, over the turn's steps and it. Paired
        # single steps (U = 0) time it: there it falls in one step of many.
        timed_steps, _, untimed_steps = line.partition(" ")
        untimed_steps = int(untimed_steps or 1)
        if a.mode == "tracked":
            tracker.read()
        advisor_before = advisor_counters()
        _, warm_host = timed(untimed_steps)
        probes = [probe_ms()]
        steal_before = host_steal_ticks()
        if counters.available:
            counters.start()
        kernel_before = job_thread_counters(job_cores)
        cpu_before = thread_cpu_ns()
        gpu, host = timed(int(timed_steps))
        cpu = by_group(cpu_before, thread_cpu_ns(), 1e6)
        kernel = counters_between(kernel_before, job_thread_counters(job_cores))
        instructions = by_group({}, counters.read(), 1) if counters.available else None
        steal_after = host_steal_ticks()
        probes.append(probe_ms())
        advisor = counters_between(advisor_before, advisor_counters())
        print(json.dumps({"workload": a.workload, "mode": a.mode, "under_allocd_run": under_run,
                          "steps": len(gpu),
                          "gpu_ms": [g * 1e3 for g in gpu], "host_ms": [h * 1e3 for h in host],
                          "gpu_ms_median": statistics.median(gpu) * 1e3,
                          "host_ms_median": statistics.median(host) * 1e3,
                          "cpu_ms_by_thread": cpu, "job_kernel_counts": kernel,
                          "probe_ms": probes,
                          "steal_ticks": None if steal_before is None or steal_after is None
                          else steal_after - steal_before,
                          "advisor": advisor, "advisor_steps": len(gpu) + untimed_steps,
                          "warm_host_ms": sum(warm_host) * 1e3,
                          "instructions": instructions,
                          "instructions_scope": counters.scope,
                          "max_reserved": torch.cuda.max_memory_reserved(),
                          "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}),
              flush=True)


if __name__ == "__main__":
    main()
