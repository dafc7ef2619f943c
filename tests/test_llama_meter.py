"""The meter's kinds for the Llama family: an untied model's output matrix (lm_head) is searched for the next token
and its token table (embed_tokens) fetched by id, as GPT-2's wte is, so the requests table reads the same for both."""

from __future__ import annotations

from vecgpt import families, weights
from vecgpt.api import generate
from vecgpt.engine import Engine
from vecgpt.loading import push

SHAPE = {"n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32, "n_inner": 48, "n_ctx": 32, "n_vocab": 300}


def per_token(make_store, model) -> dict:
    store = make_store("memory")
    key = push(store, model, "l2", progress=False, layout="five")["fingerprint"]
    with Engine(store, model=key).open() as text:
        generate(text, [3, 1, 4, 1, 5], 3, stop=False)
        return text.meter.summary()["per_token"][-1]


def test_an_untied_models_output_and_token_table_are_counted_as_gpt2s(make_store, tmp_path, tiny_model):
    untied = weights.load(str(weights.make_llama_model(tmp_path / "m", families.LlamaHParams(**SHAPE), seed=1)))
    assert not untied.hparams.tied
    llama, gpt2 = per_token(make_store, untied), per_token(make_store, tiny_model)
    n_layer = SHAPE["n_layer"]
    for got in (llama, gpt2):  # a generated token: its row fetched, 4 matrices a layer, one token search
        assert got["by_kind"]["matrix"] == 4 * n_layer
        assert got["by_kind"]["token_search"] == got["round_trips_by_kind"]["token_search"] == 1
        assert got["by_kind"]["lookup"] == 1
    assert set(llama["by_kind"]) == set(gpt2["by_kind"])
    assert llama["round_trips_by_kind"]["lookup"] == 1  # untied, a token's row is a round of its own
    assert "lookup" not in gpt2["round_trips_by_kind"]  # GPT-2's rides with the token search
