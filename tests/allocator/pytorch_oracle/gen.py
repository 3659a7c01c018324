import json, random
R = random.Random(2011)
KEYS = ["max_split_size_mb","max_non_split_rounding_mb","garbage_collection_threshold","roundup_power2_divisions",
 "expandable_segments","pinned_use_background_threads","large_segment_size_mb","backend","release_lock_on_cudamalloc",
 "release_lock_on_hipmalloc","pinned_use_cuda_host_register","pinned_use_hip_host_register","pinned_num_register_threads",
 "pinned_reserve_segment_size_mb","graph_capture_record_stream_reuse","per_process_memory_fraction"]
BAD_KEYS = ["roundup_power2","allocator","max_split_size","Expandable_segments","foo","gc_threshold","max_split_size_MB"]
INTS = ["0","1","2","3","4","8","16","11","10","19","20","21","32","64","128","256","1024","4096","-1","+8","0x10","12abc","abc","64MB",
 "99999999999999999999","18446744073709551615","17592186044416","", "1 28"]
FLOATS = ["0.5","0","1","1.0","nan","inf","1e-310","1e-5",".25","0x0.8p0","0.999","-0.5","2","0.8abc","abc"]
BOOLS = ["True","False","true","false","1","yes","", "Tr ue"]
BACKENDS = ["native","cudaMallocAsync","cudamallocasync","async",""]
BOUNDS = ["1","2","4","8","16","32","64","128","256","1024","2048","32768","65536","3","0",">",">","x"]
DIVS = ["0","1","2","4","8","16","3","","-8"]
def value_for(key):
    if key in ("garbage_collection_threshold","per_process_memory_fraction"): return R.choice(FLOATS)
    if key in ("expandable_segments","pinned_use_background_threads","release_lock_on_cudamalloc","release_lock_on_hipmalloc",
               "pinned_use_cuda_host_register","pinned_use_hip_host_register","graph_capture_record_stream_reuse"): return R.choice(BOOLS)
    if key == "backend": return R.choice(BACKENDS)
    if key == "roundup_power2_divisions" and R.random() < 0.75:
        n = R.randint(0, 5)
        return "[" + ",".join(R.choice(BOUNDS) + ":" + R.choice(DIVS) for _ in range(n)) + "]"
    return R.choice(INTS)
def item():
    key = R.choice(KEYS) if R.random() < 0.9 else R.choice(BAD_KEYS)
    return key + ":" + value_for(key)
def mutate(s):
    ops = R.randint(0, 2) if R.random() < 0.4 else 0
    for _ in range(ops):
        if not s: break
        p = R.randrange(len(s) + 1)
        c = R.random()
        if c < 0.3: s = s[:p] + R.choice(",:[] \t") + s[p:]
        elif c < 0.6 and p < len(s): s = s[:p] + s[p+1:]
        elif c < 0.8: s = s[:p] + R.choice(["True","64",",",">:2","]"]) + s[p:]
        else: s = s.replace(":", ",", 1) if R.random() < 0.5 else s.replace(",", ":", 1)
    return s
def conf():
    n = R.choice([0,1,1,2,2,3,4])
    return mutate(",".join(item() for _ in range(n)))
env = [conf() for _ in range(520)]
env += ["backend:cudaMallocAsync," + conf() for _ in range(40)]
cases = [{"mode":"env","env":{"PYTORCH_CUDA_ALLOC_CONF": s}} for s in env]
for _ in range(120):
    cases.append({"mode":"update","env":{},"updates":[conf() for _ in range(30)]})
for _ in range(6):
    cases.append({"mode":"update","env":{"PYTORCH_CUDA_ALLOC_CONF":"backend:cudaMallocAsync"},"updates":[conf() for _ in range(30)]})
# cudaMallocAsync defers the CUDA-specific pass: does pinned memory surface it?
for s in ["backend:cudaMallocAsync,pinned_num_register_threads:3", "backend:cudaMallocAsync,backend:native", "backend:cudaMallocAsync,per_process_memory_fraction:2"]:
    cases.append({"mode":"env","env":{"PYTORCH_CUDA_ALLOC_CONF": s},"pinned":True})
    cases.append({"mode":"update","env":{"PYTORCH_CUDA_ALLOC_CONF": s},"updates":[""]})
json.dump(cases, open("cases_random.json", "w"))
print(len(cases), sum(len(c.get("updates",[])) for c in cases))
