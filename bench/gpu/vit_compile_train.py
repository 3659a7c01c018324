"""A vision transformer trained under torch.compile, a job of a kind the
autotuner was not built with: a ViT-B/16-shaped model (timm
vit_base_patch16_224, randomly initialised), torch.compile(dynamic=True) in
its default mode (one graph for every batch size, so that a run compiles
once; Inductor's on-disk cache makes later runs on the same machine start
fast), bf16 autocast, AdamW, 224 px images in a random batch (16-128) every
step.

    python vit_compile_train.py --mode native|advise|transparent [--steps N] [--json OUT]
"""
import tuned_job


def build(torch, a):
    import timm
    model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000).cuda()
    return {"model": model, "compiled": torch.compile(model, dynamic=True),
            "opt": torch.optim.AdamW(model.parameters(), lr=1e-4)}


def step(torch, s, rng):
    batch = rng.choice([16, 32, 48, 64, 96, 128])
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(s["compiled"](x), y)
    loss.backward()
    s["opt"].step()
    s["opt"].zero_grad(set_to_none=True)
    return loss.item()


if __name__ == "__main__":
    tuned_job.run(tuned_job.parser(__doc__, "vit_compile").parse_args(), build, step)
