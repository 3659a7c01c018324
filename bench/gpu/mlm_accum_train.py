"""A job of a kind the autotuner was not built with: masked-language-model
pre-training of a BERT-shaped encoder (transformers BertForMaskedLM from a
config, 8 layers of 768, randomly initialised) with gradient accumulation:
four micro-batches per optimizer step, each dynamically padded (batch 8-64,
length 32-512, drawn for each micro-batch), so that a step mark ends four
forward and backward passes of different shapes. bf16 autocast, AdamW. Its
optimizer steps take tens of milliseconds: a decision that lags by a
fraction of a second is several steps late.

    python mlm_accum_train.py --mode native|advise|transparent [--steps N] [--json OUT]
"""
import tuned_job

MICRO_BATCHES = 4
VOCAB = 30522


def build(torch, a):
    from transformers import BertConfig, BertForMaskedLM
    config = BertConfig(vocab_size=VOCAB, hidden_size=768, num_hidden_layers=8,
                        num_attention_heads=12, intermediate_size=3072,
                        max_position_embeddings=512)
    model = BertForMaskedLM(config).cuda()
    return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-4)}


def step(torch, s, rng):
    total = 0.0
    for _ in range(MICRO_BATCHES):
        batch = rng.choice([8, 16, 32, 64])
        length = rng.choice([32, 64, 128, 256, 384, 512])
        ids = torch.randint(0, VOCAB, (batch, length), device="cuda")
        labels = torch.where(torch.rand(batch, length, device="cuda") < 0.15, ids,
                             torch.full_like(ids, -100))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = s["model"](input_ids=ids, labels=labels).loss / MICRO_BATCHES
        loss.backward()
        total += loss.item()
    s["opt"].step()
    s["opt"].zero_grad(set_to_none=True)
    return total


if __name__ == "__main__":
    tuned_job.run(tuned_job.parser(__doc__, "mlm_accum").parse_args(), build, step)
