"""Hooks into PyTorch where a process starts doing what an allocator config
must not break (the daemon's JobFeatures; docs/compatibility.md says what
PyTorch 2.11 cannot combine with each), and the capture guard.

Each hook reports its feature once, through the client library
(allocd_report_features), which sends it to the daemon at once; what the
features rule out is decided there. The hooks:

- CUDA IPC: UntypedStorage._share_cuda_, which torch.multiprocessing's
  reductions (reduce_tensor, reduce_storage) call to send a CUDA tensor;
- CUDA graphs: CUDAGraph.capture_begin (torch.cuda.graph, make_graphed_callables,
  torch.compile's cudagraph trees);
- MemPool: torch.cuda.MemPool's creation;
- NCCL registration: ProcessGroupNCCL.register_mem_pool (the allocator hook's
  TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK is read by the client library
  at registration).

The capture guard: from capture_begin to capture_end the advisor's round
lock is held, so a push (a settings change and empty_cache(), which PyTorch
refuses while a capture is underway) is applied between captures, never
inside one.
"""

import threading

# allocd_client.h's ALLOCD_FEATURE_* bits.
CUDA_IPC = 1
CUDA_GRAPHS = 2
MEM_POOL = 4
NCCL_REGISTRATION = 8


class FeatureHooks:
    """The hooks on `torch`, reporting through `report(bits)`; `round_lock`
    (the advisor's) is held while a CUDA graph is captured. remove() puts
    PyTorch's functions back."""

    def __init__(self, torch, report, round_lock):
        self._torch = torch
        self._report = report
        self._round_lock = round_lock
        self._reported = 0
        self._mu = threading.Lock()
        self._captures = 0
        self._patched = []  # (owner, name, original)

    @property
    def capturing(self):
        """Whether a CUDA graph capture is underway."""
        return self._captures > 0

    def attach(self):
        torch = self._torch
        storage = getattr(torch, "UntypedStorage", None)
        self._wrap(storage, "_share_cuda_", self._reporting(CUDA_IPC))
        graphs = getattr(getattr(torch, "cuda", None), "graphs", None)
        graph = getattr(graphs, "CUDAGraph", None)
        self._wrap(graph, "capture_begin", self._capture_begin)
        self._wrap(graph, "capture_end", self._capture_end)
        memory = getattr(getattr(torch, "cuda", None), "memory", None)
        self._wrap(getattr(memory, "MemPool", None), "__init__", self._reporting(MEM_POOL))
        distributed = getattr(torch, "distributed", None)
        nccl = getattr(distributed, "ProcessGroupNCCL", None)
        self._wrap(nccl, "register_mem_pool", self._reporting(NCCL_REGISTRATION))
        return self

    def remove(self):
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched = []

    def report(self, bits):
        """Reports `bits` unless they were already."""
        with self._mu:
            new = bits & ~self._reported
            self._reported |= bits
        if new:
            self._report(new)

    def _wrap(self, owner, name, make):
        original = getattr(owner, name, None) if owner is not None else None
        if original is None:
            return
        try:
            setattr(owner, name, make(original))
        except (AttributeError, TypeError):  # a class that takes no new attributes
            return
        self._patched.append((owner, name, original))

    def _reporting(self, bits):
        def make(original):
            def hooked(*args, **kwargs):
                self.report(bits)
                return original(*args, **kwargs)
            return hooked
        return make

    def _capture_begin(self, original):
        def capture_begin(*args, **kwargs):
            self.report(CUDA_GRAPHS)
            self._enter_capture()
            try:
                return original(*args, **kwargs)
            except BaseException:
                self._leave_capture()
                raise
        return capture_begin

    def _capture_end(self, original):
        def capture_end(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            finally:
                self._leave_capture()
        return capture_end

    def _enter_capture(self):
        # The first capture takes the round lock (waiting for a round under
        # way to end); captures on other threads meanwhile share it.
        with self._mu:
            if self._captures == 0:
                self._round_lock.acquire()
            self._captures += 1

    def _leave_capture(self):
        with self._mu:
            if self._captures == 0:
                return
            self._captures -= 1
            if self._captures == 0:
                self._round_lock.release()
