"""A job of a kind the autotuner was not built with: a ConvNeXt-T (timm
convnext_tiny, randomly initialised) trained with gradient accumulation (four
micro-batches per optimizer step, so each step mark ends four forward and
backward passes), channels_last, bf16 autocast, SGD with Nesterov momentum,
and multi-scale micro-batches (batch 8-48 and 128-256 px, drawn for each
micro-batch). Its optimizer steps take tens of milliseconds: a decision that
lags by a fraction of a second is several steps late.

    python convnext_accum_train.py --mode native|advise|transparent [--steps N] [--json OUT]
"""
import tuned_job

MICRO_BATCHES = 4


def build(torch, a):
    import timm
    model = timm.create_model("convnext_tiny", pretrained=False, num_classes=1000)
    model = model.cuda().to(memory_format=torch.channels_last)
    return {"model": model,
            "opt": torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)}


def step(torch, s, rng):
    total = 0.0
    for _ in range(MICRO_BATCHES):
        batch = rng.choice([8, 16, 24, 32, 48])
        size = rng.choice([128, 160, 192, 224, 256])
        x = torch.randn(batch, 3, size, size, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(s["model"](x), y) / MICRO_BATCHES
        loss.backward()
        total += loss.item()
    s["opt"].step()
    s["opt"].zero_grad(set_to_none=True)
    return total


if __name__ == "__main__":
    tuned_job.run(tuned_job.parser(__doc__, "convnext_accum").parse_args(), build, step)
