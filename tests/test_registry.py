"""Finding stores: the in-tree ones by their file, another package's through the entry point group vecgpt.stores."""

import inspect
import textwrap
from pathlib import Path

import numpy as np
import pytest

from vecgpt import tokenizer
from vecgpt.backends.base import available, connector, get_store, in_tree, installed
from vecgpt.config import load_config
from vecgpt.engine import Engine
from vecgpt.errors import VecgptError
from vecgpt.loading import push
from vecgpt.reference import Reference

EXAMPLE = '''
"""A store from another package: vecgpt's memory store under another name."""

from vecgpt.backends.memory import MemoryStore


class ExampleStore(MemoryStore):
    backend = "example"


def connect(path: str | None = None, greeting: str = "hi") -> ExampleStore:
    return ExampleStore(path)
'''


@pytest.fixture
def example_package(tmp_path, monkeypatch):
    """An installed package as importlib.metadata sees one: the module and its dist-info on sys.path."""
    root = tmp_path / "site"
    (root / "vecgpt_example_store").mkdir(parents=True)
    (root / "vecgpt_example_store" / "__init__.py").write_text(EXAMPLE)
    info = root / "vecgpt_example_store-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vecgpt-example-store\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent("""\
        [vecgpt.stores]
        example = vecgpt_example_store:connect
        broken = vecgpt_example_store_missing:connect
    """)
    )
    monkeypatch.syspath_prepend(str(root))
    return root


def test_in_tree_stores_are_the_modules_with_connect():
    assert {"memory", "faiss", "lancedb", "pgvector", "turbopuffer"} <= set(in_tree())
    assert not {"base", "_in_process"} & set(in_tree())


def test_every_shipped_config_names_an_in_tree_store_and_only_options_its_connect_takes():
    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))
    assert {"faiss.toml", "faiss-l2.toml", "pgvector.toml", "pgvector-l2.toml"} <= {p.name for p in configs}
    for path in configs:
        config = load_config(path)
        assert config.backend in in_tree(), path
        inspect.signature(connector(config.backend)).bind(**config.store)  # TypeError: an option it does not take


def test_entry_point_store_is_found_and_runs_the_engine(example_package, tmp_path, tiny_model, tiny_model_dir):
    assert {"example", "broken"} <= set(installed()) and "example" in available()
    store = get_store("example", path=str(tmp_path / "store"))
    push(store, tiny_model, "l2", progress=False)
    ids = tokenizer.encode("Hello world")
    ours = Engine(store).open().read(ids)
    ref = Reference(tiny_model, np.float64).read(ids)
    assert ours.ids[0] == ref.ids[0]  # the top token; its logit within float32 store rounding (see test_engine)
    np.testing.assert_allclose(ours.logits[0], ref.logits[0], rtol=0, atol=1e-4)


def test_entry_point_store_errors_say_what_to_do(example_package):
    with pytest.raises(VecgptError, match="takes no option 'colour'.*path, greeting"):
        get_store("example", colour="red")
    with pytest.raises(VecgptError, match="needs vecgpt_example_store_missing"):
        get_store("broken")
    with pytest.raises(VecgptError, match="unknown backend 'nope'; known backends: .*example"):
        get_store("nope")


def test_a_store_package_registers_by_its_init_and_offers_a_cost_estimate():
    from vecgpt.backends.base import extra

    assert "turbopuffer" in in_tree()  # vecgpt/backends/turbopuffer/__init__.py defines connect
    assert callable(extra("turbopuffer", "estimate_cost"))
    assert extra("memory", "estimate_cost") is None
