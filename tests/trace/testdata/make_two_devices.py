"""Writes two_devices.pickle, the 2-device snapshot fixture of
tests/trace/snapshot_reader_test.cc.

It has the shape of torch.cuda.memory._snapshot() (PyTorch 2.11) with stacks
recorded: event dicts with `frames` lists whose frame dicts repeat, so the
pickle exercises the memo the way real snapshots with stacks do. Run it with
any Python 3 (protocol 4, CPython's default):  python3 make_two_devices.py
"""
import pickle

FRAMES = [
    {"filename": "train.py", "line": 42, "name": "forward"},
    {"filename": "torch/nn/modules/linear.py", "line": 125, "name": "forward"},
]


def event(action, addr, size, stream, frames=True):
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": stream,
        "time_us": 1795346834268383 + addr % 1000,
        "compile_context": "N/A",
        "user_metadata": "",
        "frames": FRAMES if frames else [],
    }


SEG0 = 0x7F0000000000
SEG1 = 0x7F1000000000
snapshot = {
    "segments": [
        {"device": 0, "address": SEG0, "total_size": 2097152,
         "allocated_size": 512, "active_size": 512, "requested_size": 500,
         "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
         "is_expandable": False, "frames": FRAMES,
         "blocks": [{"address": SEG0, "size": 512, "requested_size": 500,
                     "state": "active_allocated", "frames": FRAMES}]},
    ],
    "device_traces": [
        [
            event("segment_alloc", SEG0, 2097152, 0),
            event("alloc", SEG0, 500, 0),
            event("alloc", SEG0 + 512, 1000, 0),
            event("free_requested", SEG0 + 512, 1000, 0),
            event("free_completed", SEG0 + 512, 1000, 0),
            event("oom", 1 << 30, 1 << 40, 0, frames=False),
        ],
        [
            event("segment_alloc", SEG1, 20971520, 7),
            event("alloc", SEG1, 4096, 7),
            event("alloc", SEG1 + 4096, 8192, 3),
            event("free_requested", SEG1, 4096, 7),
            event("alloc", SEG1 + 12288, 100, 7),
            event("free_completed", SEG1, 4096, 7),
            event("segment_free", 0x7F2000000000, 2097152, 7, frames=False),
        ],
    ],
    "allocator_settings": {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False,max_split_size_mb:128",
        "max_split_size": 134217728,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": False,
        "roundup_power2_divisions": {"1": 0, "2": 0},
    },
    "external_annotations": [
        {"stage": "START", "name": "step", "device": 0, "time_us": 1},
    ],
}

with open("two_devices.pickle", "wb") as f:
    pickle.dump(snapshot, f, protocol=4)
