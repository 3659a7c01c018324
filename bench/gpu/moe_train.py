"""A mixture-of-experts decoder trained on dynamic token counts, a job of a
kind the autotuner was not built with: a randomly initialised decoder whose
feed-forward layers are 8 experts with top-2 routing, bf16 autocast, AdamW,
and every batch of its own size and length (as with packed, length-grouped
data): each expert gets a different number of tokens at every layer of every
step, so the expert matmuls' shapes never repeat.

    python moe_train.py --mode native|advise|transparent [--steps N] [--json OUT]
"""
import tuned_job

VOCAB, WIDTH, LAYERS, HEADS, EXPERTS, HIDDEN = 32000, 1024, 8, 16, 8, 2816


def build(torch, a):
    nn = torch.nn

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(WIDTH, EXPERTS, bias=False)
            self.w_in = nn.Parameter(torch.randn(EXPERTS, WIDTH, 2 * HIDDEN) * WIDTH ** -0.5)
            self.w_out = nn.Parameter(torch.randn(EXPERTS, HIDDEN, WIDTH) * HIDDEN ** -0.5)

        def forward(self, x):
            tokens = x.reshape(-1, WIDTH)
            weights, experts = self.router(tokens).softmax(-1).topk(2, dim=-1)
            out = torch.zeros_like(tokens)
            for e in range(EXPERTS):
                rows, slot = (experts == e).nonzero(as_tuple=True)
                if rows.numel() == 0:
                    continue
                gate, up = (tokens[rows] @ self.w_in[e]).chunk(2, dim=-1)
                y = (nn.functional.silu(gate) * up) @ self.w_out[e]
                out.index_add_(0, rows, (y * weights[rows, slot, None]).to(out.dtype))
            return out.reshape_as(x)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.RMSNorm(WIDTH), nn.RMSNorm(WIDTH)
            self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH, bias=False), nn.Linear(WIDTH, WIDTH, bias=False)
            self.moe = MoE()

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, HEADS, -1).transpose(1, 3).unbind(2)
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, n, WIDTH))
            return x + self.moe(self.norm2(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, WIDTH)
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
            self.norm, self.head = nn.RMSNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)

        def forward(self, ids):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))

    model = Decoder().cuda()
    return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-4)}


def step(torch, s, rng):
    batch = rng.choice([2, 4, 8, 16])
    length = rng.randint(128, 8192 // batch)
    ids = torch.randint(0, VOCAB, (batch, length + 1), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = s["model"](ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, VOCAB), ids[:, 1:].reshape(-1))
    loss.backward()
    s["opt"].step()
    s["opt"].zero_grad(set_to_none=True)
    return loss.item()


if __name__ == "__main__":
    tuned_job.run(tuned_job.parser(__doc__, "moe").parse_args(), build, step)
