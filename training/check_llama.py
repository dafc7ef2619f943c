"""Check the exported Llama demo model with numpy alone (vecgpt's reader and reference_llama; no torch).

Loads vecgpt/models/shakespeare-llama (or --model DIR) as vecgpt does, recomputes the validation loss on the first
4,096 validation tokens in float32 and compares it with config.json's vecgpt.val_loss_nats_first_4096_tokens,
computed by torch at export (a match proves the export layout: names, [out, in], rotary halves, tied output),
then writes greedy and sampled text.

    python training/check_llama.py [--model DIR] [--text PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from vecgpt import tokenizer, weights
from vecgpt.reference_llama import LlamaReference, generate

REPO_ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["ROMEO:", "JULIET:\n", "First Citizen:\n", "KING HENRY:", "To be, or not"]


def validation_loss(model, text_path: Path, windows: int = 16, ctx: int = 256) -> float:
    """Mean next-token loss (nats) over `windows` non-overlapping windows of the held-out last 10%."""
    text = text_path.read_text(encoding="utf-8")
    val = np.array(tokenizer.encoding().encode_ordinary(text[int(len(text) * 0.9) :]))
    total = 0.0
    for i in range(windows):
        x, y = val[i * ctx : (i + 1) * ctx], val[i * ctx + 1 : (i + 1) * ctx + 1]
        logits = LlamaReference(model, np.float32).logits(x).astype(np.float64)
        top = logits.max(-1, keepdims=True)
        lse = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[:, 0]
        total += float((lse - logits[np.arange(ctx), y]).sum())
    return total / (windows * ctx)


def sampled(model, ids: list[int], n: int, rng, temperature=0.8, k=40) -> list[int]:
    ref, out = LlamaReference(model, np.float32), []
    logits = ref.logits(ids)[-1].astype(np.float64)
    for _ in range(n):
        best = np.argsort(-logits)[:k]
        p = np.exp((logits[best] - logits[best[0]]) / temperature)
        out.append(int(rng.choice(best, p=p / p.sum())))
        logits = ref.logits(out[-1:])[-1].astype(np.float64)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="shakespeare-llama")
    ap.add_argument("--text", default=str(REPO_ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"))
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    model = weights.load(args.model)
    meta = json.loads((Path(model.source) / "config.json").read_text()).get("vecgpt", {})
    loss = validation_loss(model, Path(args.text))
    print(f"model: {model.source} ({model.hparams})")
    print(f"numpy val loss, first 4096 validation tokens: {loss:.4f} nats/token")
    if "val_loss_nats_first_4096_tokens" in meta:
        ref = meta["val_loss_nats_first_4096_tokens"]
        print(f"torch val loss at export, same tokens:        {ref:.4f} (diff {loss - ref:+.5f})")
        assert abs(loss - ref) < 2e-3, "numpy and torch disagree: the export layout is wrong"
    tok, rng = model.tokenizer, np.random.default_rng(args.seed)
    print("\n=== greedy, 40 tokens ===")
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        print(f"--- {prompt!r}\n{tok.decode(ids + generate(LlamaReference(model, np.float32), ids, 40))}")
    print(f"\n=== sampled, temperature 0.8, top-k 40, 40 tokens, seed {args.seed} ===")
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        print(f"--- {prompt!r}\n{tok.decode(ids + sampled(model, ids, 40, rng))}")


if __name__ == "__main__":
    main()
