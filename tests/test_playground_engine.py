"""The playground builds its engines as `vecgpt generate` does (vecgpt.api.config_engine): every reading setting of
a config reaches them, HNSW attention (attention_index) included."""

from __future__ import annotations

from vecgpt import api, weights
from vecgpt.config import load_config
from vecgpt.playground.server import Settings

from browser import Running, call, events
from conftest import tiny_params

SETTINGS = ("top_k", "prompt_block", "attention_top_k", "attention_index", "key")


def test_a_config_asking_for_hnsw_runs_hnsw_in_the_playground(tmp_path):
    hp = weights.HParams(n_layer=2, n_head=4, n_embd=64, n_ctx=64, n_vocab=512)
    model = weights.save(tmp_path / "model", hp, tiny_params(hp))
    config = tmp_path / "hnsw.toml"
    config.write_text(
        f'model = "{model}"\nmetric = "ip"\ntop_k = 12\nprefill_chunk = 3\nattention_top_k = 2\n'
        f'attention_index = "hnsw"\n[store]\npath = "{tmp_path / "faiss"}"\n'
    )
    server = Running(Settings(configs=[str(config)]))
    try:
        status, view = call(f"{server.url}/api/texts", "POST", {"prompt": " the and the", "top_k": 5})
        assert status == 200, view
        assert events(f"{server.url}/api/texts/{view['id']}/generate?n=2")[-1][0] == "done"
        mine = server.library.shelves[0].engine(view["model"])
        cli = api.engine_for_text(load_config(str(config)), view["id"])  # what `generate --resume ID` runs on
        try:
            assert mine.attention_index == "hnsw" and mine.attention_top_k == 2
            assert {s: getattr(mine, s) for s in SETTINGS} == {s: getattr(cli, s) for s in SETTINGS}
        finally:
            cli.store.close()
    finally:
        server.stop()
