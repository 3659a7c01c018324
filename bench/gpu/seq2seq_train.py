"""An encoder-decoder full fine-tune with dynamic padding, a job of a kind the
autotuner was not built with: a T5-base-shaped model (randomly initialised),
bf16 autocast, AdamW, and every batch padded to its own longest source and
target (batch 4-32, lengths random), so no two steps allocate alike.

    python seq2seq_train.py --mode native|advise|transparent [--steps N] [--json OUT]
"""
import tuned_job


def build(torch, a):
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(d_model=768, d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12,
                   vocab_size=32128, decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(cfg).cuda()
    return {"model": model, "cfg": cfg,
            "opt": torch.optim.AdamW(model.parameters(), lr=1e-4)}


def step(torch, s, rng):
    batch = rng.choice([4, 8, 16, 32])
    source = rng.randint(32, 4096 // batch)
    target = rng.randint(16, 2048 // batch)
    vocab = s["cfg"].vocab_size
    ids = torch.randint(0, vocab, (batch, source), device="cuda")
    labels = torch.randint(0, vocab, (batch, target), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = s["model"](input_ids=ids, labels=labels).loss
    loss.backward()
    s["opt"].step()
    s["opt"].zero_grad(set_to_none=True)
    return loss.item()


if __name__ == "__main__":
    tuned_job.run(tuned_job.parser(__doc__, "seq2seq").parse_args(), build, step)
