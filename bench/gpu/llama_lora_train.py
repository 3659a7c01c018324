"""The llama_lora workload of traces/record_workload.py (a LoRA fine-tune of a
randomly initialised Llama-style model, variable batch and length), as a
measured training run: loss and time of every step, peak reserved memory as
the allocator sees it, and the GPU's used memory as nvidia-smi sees it.

    python llama_lora_train.py --mode native|transparent|engine|advise [--steps N] [--seed S]
        [--socket PATH] [--json OUT] [--kill-daemon-at STEP --daemon-pid PID]
        [--deterministic]

--mode native uses PyTorch's allocator with $PYTORCH_CUDA_ALLOC_CONF;
--mode transparent calls allocd.enable() before importing torch (PyTorch's
allocator on daemon memory); --mode engine (or allocd) calls
allocd.enable(mode="engine") (allocd's engine behind CUDAPluggableAllocator);
--mode advise keeps PyTorch's allocator and calls allocd.advise(). Under
transparent and advise, the daemon's autotuner gets the allocation stream and
may push configs: the result then has each step's peak reserved, the config
each step ended on, and allocd.stats() (the config run at the end and why).
The daemon must serve --backend cuda. Run each mode in a fresh process.
Step times are CUDA-event times of each step.
"""
import argparse
import json
import os
import random
import subprocess
import threading
import time

import deterministic
import tuned_job
from daemon_kill import kill_daemon


def gpu_used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                          "-i", os.environ.get("ALLOCD_GPU_INDEX", "0")],
                         capture_output=True, text=True, timeout=30).stdout
    return int(out.split()[0])


class UsedMemoryWatch:
    """The GPU's memory.used (all processes, the daemon's included), sampled."""

    def __init__(self, period=0.2):
        self.peak = 0
        self._period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)

    def _run(self, period):
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, gpu_used_mib())
            except Exception:  # nvidia-smi busy: skip a sample
                pass
            self._stop.wait(period)

    def __enter__(self):
        if self._period > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._period > 0:
            self._thread.join()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["native", "transparent", "engine", "allocd", "advise"],
                   required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--socket", default=os.environ.get("ALLOCD_SOCKET", "/run/allocd/allocd.sock"))
    p.add_argument("--job", default="llama-lora")
    p.add_argument("--json", help="write the result here too")
    p.add_argument("--kill-daemon-at", type=int, help="SIGKILL --daemon-pid after this step")
    p.add_argument("--daemon-pid", type=int)
    p.add_argument("--restart-daemon", help="shell command that starts the daemon again")
    p.add_argument("--shape", type=lambda s: tuple(int(x) for x in s.split("x")),
                   help="BATCHxSEQLEN for every step (default: the workload's varying shapes); "
                        "fixed shapes make step times comparable to 1%%")
    p.add_argument("--autotune-mode", choices=["off", "recommend", "apply"],
                   help="the job's autotune mode (default: the daemon's); recommend records and "
                        "decides without pushing, so the config stays the one the run started with")
    p.add_argument("--no-record-events", action="store_true",
                   help="transparent/advise: no allocation stream to the autotuner (stats only)")
    p.add_argument("--smi-period", type=float, default=0.2,
                   help="seconds between nvidia-smi samples of the GPU's used memory (0: none; "
                        "each sample is a process that takes the driver's lock: off to time steps)")
    deterministic.add_argument(p)
    a = p.parse_args()
    deterministic.before_torch(a)

    baseline_mib = gpu_used_mib()
    engine = a.mode in ("engine", "allocd")
    # PyTorch's own allocator with a daemon session: steps are tracked one by one.
    tracked = a.mode in ("transparent", "advise")
    if a.mode in ("transparent", "engine", "allocd"):
        import allocd
        allocd.enable(socket=a.socket, job=a.job, required=True,
                      mode="engine" if engine else "transparent",
                      autotune_mode=a.autotune_mode, record_events=not a.no_record_events)
    import torch
    deterministic.after_torch(a, torch)
    if a.mode == "advise":
        import allocd
        allocd.advise(socket=a.socket, job=a.job, required=True, autotune_mode=a.autotune_mode,
                      record_events=not a.no_record_events)

    from transformers import LlamaConfig, LlamaForCausalLM
    from peft import LoraConfig, get_peft_model

    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16,
                      num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096,
                      # SDPA's fused backward kernels have no deterministic form.
                      attn_implementation="eager" if a.deterministic else None)
    torch.manual_seed(a.seed)
    with UsedMemoryWatch(a.smi_period) as watch:
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
        # From an empty GPU to the model on it (built on the CPU first, ~10 s
        # that would drown it): where a returning job pays for chunks a
        # trimmed pool must create again.
        setup_start = time.perf_counter()
        model = model.cuda()
        torch.cuda.synchronize()
        setup_seconds = time.perf_counter() - setup_start
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
        lcfg = LoraConfig(r=32, lora_alpha=16, lora_dropout=0.0, bias="none",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                          "down_proj"])
        model = get_peft_model(model, lcfg)
        opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4)
        rng = random.Random(a.seed)
        losses, times, step_peaks, step_allocated, step_configs, step_ends = [], [], [], [], [], []
        run_peak = run_allocated = 0
        for step in range(a.steps):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            bs = rng.choice([1, 2, 4, 8])
            seqlen = rng.randint(64, 4096 // bs)
            if a.shape:
                bs, seqlen = a.shape
            ids = torch.randint(0, cfg.vocab_size, (bs, seqlen), device="cuda")
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            end.record()
            losses.append(out.loss.item())
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000)
            step_ends.append(time.time())
            if not engine:
                # Each step's own peak, and the config it ended on: what a
                # push did to the steps after it (native: the same steps
                # without one, to compare with).
                step_peaks.append(torch.cuda.max_memory_reserved())
                run_peak = max(run_peak, step_peaks[-1])
                step_allocated.append(torch.cuda.max_memory_allocated())
                run_allocated = max(run_allocated, step_allocated[-1])
                torch.cuda.reset_peak_memory_stats()
            if tracked:
                step_configs.append(allocd.stats().get("config", ""))
            elif tuned_job.autostarted():
                # An unchanged script under `allocd run`: the config each
                # step ended on, read from the package allocd run started.
                step_configs.append(tuned_job.config_now(tuned_job.autostarted()))
            if a.kill_daemon_at is not None and step == a.kill_daemon_at:
                kill_daemon(a.daemon_pid, a.restart_daemon, step)

    result = {
        "mode": a.mode,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "steps": a.steps,
        "seed": a.seed,
        "losses": losses,
        "step_seconds": times,
        "step_end_unix": step_ends,
        "model_to_gpu_seconds": setup_seconds,
        "gpu_used_mib_before": baseline_mib,
        "gpu_used_mib_peak": watch.peak,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
    }
    if not engine:
        result["peak_reserved"] = max(run_peak, torch.cuda.max_memory_reserved())
        result["peak_allocated"] = max(run_allocated, torch.cuda.max_memory_allocated())
        result["step_peak_reserved"] = step_peaks
        result["step_peak_allocated"] = step_allocated
    if tracked:
        s = allocd.stats()
        result["step_config"] = step_configs
        result["allocd"] = {k: s[k] for k in tuned_job.STATS_KEYS + ("advisor_seconds",)
                            if k in s}
    elif tuned_job.autostarted():
        result["step_config"] = step_configs
        try:
            s = tuned_job.autostarted().stats()
            result["allocd"] = {k: s[k] for k in tuned_job.STATS_KEYS if k in s}
        except Exception as error:  # noqa: BLE001
            result["allocd"] = {"error": str(error)}
    elif engine:
        s = allocd.stats()
        result["peak_reserved"] = s["reserved_bytes.all.peak"]
        result["peak_allocated"] = s["allocated_bytes.all.peak"]
        result["allocd"] = {k: s[k] for k in ("session_id", "config", "config_version", "reconnects",
                                               "ooms_reported", "num_device_alloc") if k in s}
    text = json.dumps(result)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
