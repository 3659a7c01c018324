# Oracle: what real PyTorch does with an allocator config string.
# argv[1] = JSON {"mode": "env"|"update", "env": {...}, "updates": [...]}
import ctypes, json, os, sys, warnings
warnings.simplefilter("ignore")
spec = json.loads(sys.argv[1])
out = {"spec": spec}

def read_state():
    import torch
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    c10 = ctypes.CDLL(os.path.join(lib, "libc10.so"))
    c10cuda = ctypes.CDLL(os.path.join(lib, "libc10_cuda.so"))
    inst = c10._ZN3c1016CachingAllocator26AcceleratorAllocatorConfig8instanceEv
    inst.restype = ctypes.c_void_p
    p = inst()
    u64 = lambda a: ctypes.c_uint64.from_address(a).value
    begin, end = u64(p + 24), u64(p + 32)
    s = {
        "large_segment_size": u64(p),
        "max_split_size": u64(p + 8),
        "max_non_split_rounding": u64(p + 16),
        "roundup": [u64(begin + 8 * k) for k in range((end - begin) // 8)],
        "gc": ctypes.c_double.from_address(p + 48).value,
        "expandable": ctypes.c_bool.from_address(p + 56).value,
        "pinned_bg": ctypes.c_bool.from_address(p + 57).value,
    }
    sp = ctypes.c_void_p.in_dll(c10cuda, "_ZZN3c104cuda20CUDACachingAllocator19CUDAAllocatorConfig8instanceEvE10s_instance").value
    if sp:
        s.update({
            "pinned_threads": u64(sp),
            "pinned_reserve_mb": u64(sp + 8),
            "release_lock": ctypes.c_bool.from_address(sp + 20).value,
            "pinned_host_register": ctypes.c_bool.from_address(sp + 21).value,
            "graph_reuse": ctypes.c_bool.from_address(sp + 22).value,
            "fraction": ctypes.c_double.from_address(sp + 24).value,
        })
    else:
        s["cuda_instance"] = None
    try:
        s["torch_fraction"] = torch.cuda.get_per_process_memory_fraction(0)
    except Exception as e:
        s["torch_fraction"] = "error: " + str(e)
    s["backend"] = torch.cuda.get_allocator_backend()
    return s

def err(e):
    return {"etype": type(e).__name__, "error": str(e)}

try:
    import torch
    out["import"] = "ok"
    torch.empty(1, device="cuda")
    out["init"] = "ok"
except BaseException as e:
    out["init"] = err(e)
if out.get("init") == "ok":
    out["state"] = read_state()
    steps = []
    for u in spec.get("updates", []):
        st = {"conf": u}
        try:
            torch.cuda.memory._set_allocator_settings(u)
            st["ok"] = True
        except BaseException as e:
            st.update(err(e))
        st["state"] = read_state()
        steps.append(st)
    out["steps"] = steps
    if spec.get("pinned"):
        try:
            torch.empty(16, pin_memory=True)
            out["pinned"] = "ok"
        except BaseException as e:
            out["pinned"] = err(e)
        out["state_after_pinned"] = read_state()
print("RESULT " + json.dumps(out))
