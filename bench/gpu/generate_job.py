"""Batched generation with a growing KV cache, a job with no optimizer and no
backward (aperiodic to the autotuner): a GPT-2-medium-shaped model (randomly
initialised, fp16), HF generate() on a random batch (1-32) of random prompt
lengths (16-512) and new-token counts (8-64), each call one "step" (short
calls, so that a run of ~14 calls takes ~10 s on an H200).

    python generate_job.py --mode native|advise|transparent [--steps N] [--json OUT]
"""
import tuned_job


def build(torch, a):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_embd=1024, n_layer=24, n_head=16, vocab_size=50257, n_positions=2048)
    model = GPT2LMHeadModel(cfg).to(torch.float16).cuda().eval()
    return {"model": model, "cfg": cfg}


def step(torch, s, rng):
    batch = rng.choice([1, 4, 8, 16, 32])
    prompt = rng.randint(16, 512)
    new = rng.randint(8, 64)
    ids = torch.randint(0, s["cfg"].vocab_size, (batch, prompt), device="cuda")
    with torch.no_grad():
        s["model"].generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                            min_new_tokens=new, do_sample=False,
                            pad_token_id=0)
    return 0.0


if __name__ == "__main__":
    tuned_job.run(tuned_job.parser(__doc__, "generate").parse_args(), build, step)
