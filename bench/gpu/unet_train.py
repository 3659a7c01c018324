"""A diffusion UNet trained on multi-aspect latents, a job of a kind the
autotuner was not built with: a hand-written latent-diffusion UNet (ResNet
blocks with GroupNorm and a timestep embedding, self-attention at the two
lowest resolutions, skip connections), bf16 autocast, AdamW, and each step
one aspect bucket of latents (square, landscape, portrait) with its batch
sized to keep the pixel count near constant, as multi-aspect training does:
the activations' shapes change every step.

    python unet_train.py --mode native|advise|transparent [--steps N] [--json OUT]
"""
import tuned_job

# (height, width) of the latents and the batch of each aspect bucket.
BUCKETS = [((64, 64), 16), ((48, 88), 16), ((88, 48), 16), ((56, 72), 18),
           ((72, 56), 18), ((40, 104), 14), ((80, 80), 10)]


def build(torch, a):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, temb):
            super().__init__()
            self.norm1, self.conv1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
            self.temb = nn.Linear(temb, cout)
            self.norm2, self.conv2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x, t):
            h = self.conv1(nn.functional.silu(self.norm1(x)))
            h = h + self.temb(t)[:, :, None, None]
            h = self.conv2(nn.functional.silu(self.norm2(h)))
            return h + self.skip(x)

    class Attention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.norm, self.attn = nn.GroupNorm(32, c), nn.MultiheadAttention(c, 8, batch_first=True)

        def forward(self, x):
            b, c, h, w = x.shape
            y = self.norm(x).flatten(2).transpose(1, 2)
            y, _ = self.attn(y, y, y, need_weights=False)
            return x + y.transpose(1, 2).reshape(b, c, h, w)

    class UNet(nn.Module):
        def __init__(self, widths=(192, 384, 576, 768), temb=768):
            super().__init__()
            self.temb = nn.Sequential(nn.Linear(192, temb), nn.SiLU(), nn.Linear(temb, temb))
            self.inp = nn.Conv2d(4, widths[0], 3, padding=1)
            self.down, self.down_attn, self.pool = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
            c = widths[0]
            for i, w in enumerate(widths):
                self.down.append(nn.ModuleList([Block(c, w, temb), Block(w, w, temb)]))
                self.down_attn.append(Attention(w) if i >= len(widths) - 2 else nn.Identity())
                self.pool.append(nn.Conv2d(w, w, 3, stride=2, padding=1)
                                 if i < len(widths) - 1 else nn.Identity())
                c = w
            self.mid = nn.ModuleList([Block(c, c, temb), Block(c, c, temb)])
            self.mid_attn = Attention(c)
            self.up, self.up_attn = nn.ModuleList(), nn.ModuleList()
            for i, w in reversed(list(enumerate(widths))):
                self.up.append(nn.ModuleList([Block(c + w, w, temb), Block(w, w, temb)]))
                self.up_attn.append(Attention(w) if i >= len(widths) - 2 else nn.Identity())
                c = w
            self.out = nn.Sequential(nn.GroupNorm(32, c), nn.SiLU(), nn.Conv2d(c, 4, 3, padding=1))

        def forward(self, x, t):
            half = torch.arange(96, device=x.device) / 96
            freqs = torch.exp(-9.21 * half)[None] * t[:, None]
            t = self.temb(torch.cat([freqs.sin(), freqs.cos()], dim=1))
            h, skips = self.inp(x), []
            for blocks, attn, pool in zip(self.down, self.down_attn, self.pool):
                for block in blocks:
                    h = block(h, t)
                h = attn(h)
                skips.append(h)
                h = pool(h)
            for block in self.mid:
                h = block(h, t)
            h = self.mid_attn(h)
            for blocks, attn in zip(self.up, self.up_attn):
                skip = skips.pop()
                h = nn.functional.interpolate(h, size=skip.shape[-2:], mode="nearest")
                h = blocks[0](torch.cat([h, skip], dim=1), t)
                h = attn(blocks[1](h, t))
            return self.out(h)

    model = UNet().cuda()
    return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-4)}


def step(torch, s, rng):
    (height, width), batch = rng.choice(BUCKETS)
    latents = torch.randn(batch, 4, height, width, device="cuda")
    noise = torch.randn_like(latents)
    t = torch.rand(batch, device="cuda") * 1000
    alpha = (1 - t / 1000)[:, None, None, None]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        predicted = s["model"](alpha.sqrt() * latents + (1 - alpha).sqrt() * noise, t)
        loss = torch.nn.functional.mse_loss(predicted.float(), noise)
    loss.backward()
    s["opt"].step()
    s["opt"].zero_grad(set_to_none=True)
    return loss.item()


if __name__ == "__main__":
    tuned_job.run(tuned_job.parser(__doc__, "unet").parse_args(), build, step)
