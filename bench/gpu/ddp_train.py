"""A DDP training job, one process per GPU (torchrun, NCCL), natively or with
allocd: a randomly initialised Llama-style model, each rank its own seeded
batches, fixed or varying shapes. Each rank writes its own result: its GPU
(UUID as nvidia-smi prints it), every step's local loss, CUDA-event time and
peak reserved, and what allocd says of its session.

    torchrun --nproc_per_node 2 ddp_train.py --mode native|transparent|advise
        [--steps N] [--shape BxS | --varying] [--socket PATH] [--job NAME]
        [--autotune-mode off|recommend|apply] [--out PREFIX]
        [--kill-daemon-at STEP --daemon-pid PID --restart-daemon CMD]

--mode transparent calls allocd.enable(device=LOCAL_RANK) before importing
torch; --mode advise calls allocd.advise(device=LOCAL_RANK). Results go to
PREFIX_rank<R>.json. Deterministic algorithms are on, so two native runs of
the same seed give the same losses, and a managed run must too.
"""
import argparse
import json
import os
import random

import tuned_job
from daemon_kill import kill_daemon


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["native", "transparent", "advise"], required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--shape", default="8x512", help="BATCHxSEQLEN of every step")
    p.add_argument("--varying", action="store_true",
                   help="llama_lora's varying shapes instead of --shape (what the autotuner sees)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--socket", default=os.environ.get("ALLOCD_SOCKET", "/run/allocd/allocd.sock"))
    p.add_argument("--job", default="ddp")
    p.add_argument("--autotune-mode", choices=["off", "recommend", "apply"])
    p.add_argument("--one-gpu", action="store_true",
                   help="every rank on GPU 0, over gloo (a one-GPU machine: the ranks' "
                        "mechanics, not NCCL's)")
    p.add_argument("--out", default="ddp")
    p.add_argument("--kill-daemon-at", type=int, help="rank 0 SIGKILLs --daemon-pid after this step")
    p.add_argument("--daemon-pid", type=int)
    p.add_argument("--restart-daemon", help="shell command that starts the daemon again")
    a = p.parse_args()
    local_rank = 0 if a.one_gpu else int(os.environ["LOCAL_RANK"])
    rank = int(os.environ["RANK"])
    if a.mode == "transparent":
        import allocd
        allocd.enable(socket=a.socket, job=a.job, device=local_rank, required=True,
                      autotune_mode=a.autotune_mode)
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(local_rank)
    if a.mode == "advise":
        import allocd
        allocd.advise(socket=a.socket, job=a.job, device=local_rank, required=True,
                      autotune_mode=a.autotune_mode)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    if a.one_gpu:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))

    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                      max_position_embeddings=4096)
    cfg._attn_implementation = "eager"  # deterministic backward
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    rng = random.Random(a.seed * 1000 + rank)
    gen = torch.Generator().manual_seed(a.seed * 1000 + rank)
    fixed = tuple(int(x) for x in a.shape.split("x"))
    losses, times, peaks, configs = [], [], [], []
    for step in range(a.steps):
        if a.varying:
            bs = rng.choice([1, 2, 4, 8])
            shape = (bs, rng.randint(64, 4096 // bs))
        else:
            shape = fixed
        ids = torch.randint(0, cfg.vocab_size, shape, generator=gen).cuda()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = ddp(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        torch.cuda.synchronize()
        losses.append(out.loss.item())
        times.append(start.elapsed_time(end) / 1000)
        peaks.append(torch.cuda.max_memory_reserved())
        torch.cuda.reset_peak_memory_stats()
        if a.mode != "native":
            configs.append(allocd.stats().get("config", ""))
        elif tuned_job.autostarted():
            configs.append(tuned_job.config_now(tuned_job.autostarted()))
        if rank == 0 and a.kill_daemon_at is not None and step == a.kill_daemon_at:
            kill_daemon(a.daemon_pid, a.restart_daemon, step)
    props = torch.cuda.get_device_properties(local_rank)
    uuid = str(getattr(props, "uuid", ""))
    result = {
        "mode": a.mode, "rank": rank, "local_rank": local_rank,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "device": props.name, "uuid": uuid if uuid.startswith("GPU-") else f"GPU-{uuid}",
        "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "steps": a.steps, "losses": losses, "step_seconds": times,
        "step_peak_reserved": peaks, "peak_reserved": max(peaks),
    }
    session = allocd if a.mode != "native" else tuned_job.autostarted()
    if session:
        s = session.stats()
        result["step_config"] = configs
        result["allocd"] = {k: s[k] for k in tuned_job.STATS_KEYS + ("advisor_seconds",)
                            if k in s}
    with open(f"{a.out}_rank{rank}.json", "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
