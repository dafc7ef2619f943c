"""Every field of every POST of the playground's API takes its JSON type only: a prompt is a string, a number a
finite number (a whole one where it counts something); anything else is a 400 naming the field (as the JSON
spells it, never a CLI flag) and the type it takes, and never a store error."""

from __future__ import annotations

import json

import pytest

from vecgpt import weights
from vecgpt.playground.server import Settings

from browser import Running, call, events
from conftest import tiny_params

# (path, the fields' good values, the types each takes); {id} is a text with generated positions
POSTS = {
    "/api/texts": {
        "good": {"prompt": " the", "store": 0, "temperature": 0.5, "top_k": 5, "seed": 1},
        "types": {
            "prompt": "a string",
            "store": "a whole number",
            "temperature": "a finite number",
            "top_k": "a whole number",
            "seed": "a whole number",
            "model": "a string",
        },
    },
    "/api/texts/{id}/step-back": {"good": {"position": "last"}, "types": {"position": "a whole number"}},
    "/api/texts/{id}/branch": {
        "good": {"position": "last", "token": 11},
        "types": {"position": "a whole number", "token": "a whole number"},
    },
    "/api/texts/{id}/retry": {
        "good": {"position": "last", "seed": 2},
        "types": {"position": "a whole number", "seed": "a whole number"},
    },
    "/api/texts/{id}/top-k": {"good": {"attention_top_k": 2}, "types": {"attention_top_k": "a whole number"}},
    "/api/softmax-walk": {
        "good": {"scores": "1 2 3", "tile": 1},
        "types": {"scores": "a string or an array of numbers", "tile": "a whole number"},
    },
}
BAD = {  # JSON text of a wrong value, and the words naming it in the answer
    "null": "null",
    "123": "the number 123",
    '["a"]': "an array",
    '{"a": 1}': "an object",
    "true": "true",
    '"7"': "the string '7'",
    "1e400": "infinity",
    "-1e400": "infinity",
    "NaN": "NaN",
    "2.5": "the number 2.5",
}
ACCEPTED = {  # the values of BAD that are right for a type
    "a string": {'"7"'},
    "a whole number": {"123"},
    "a finite number": {"123", "2.5"},
    "a string or an array of numbers": {'"7"'},
}


@pytest.fixture(scope="module")
def playground(tmp_path_factory):
    """A server on a small model (a 512-token vocabulary, searched fast) that lets these tests' many requests in."""
    folder = tmp_path_factory.mktemp("fields")
    hp = weights.HParams(n_layer=2, n_head=4, n_embd=64, n_ctx=64, n_vocab=512)
    model = weights.save(folder / "model", hp, tiny_params(hp))
    config = folder / "small.toml"
    config.write_text(f'model = "{model}"\n[store]\npath = "{folder / "faiss"}"\n')
    server = Running(Settings(configs=[str(config)], rate_per_s=1000.0, burst=10000.0))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def text(playground):
    status, view = call(f"{playground.url}/api/texts", "POST", {"prompt": " the", "seed": 1})
    assert status == 200, view
    assert events(f"{playground.url}/api/texts/{view['id']}/generate?n=3")[-1][0] == "done"
    yield call(f"{playground.url}/api/texts/{view['id']}")[1]
    call(f"{playground.url}/api/texts/{view['id']}", "DELETE")


CASES = [
    (path, name, kind, value)
    for path, spec in POSTS.items()
    for name, kind in spec["types"].items()
    for value in BAD
    if value not in ACCEPTED[kind] and not (name == "model" and value == "null")  # model null: the store's only model
]


@pytest.mark.parametrize(("path", "name", "kind", "value"), CASES, ids=[f"{c[0]}:{c[1]}={c[3]}" for c in CASES])
def test_a_wrong_type_is_a_400_naming_the_field_and_its_type(playground, text, path, name, kind, value):
    good = {k: (len(text["tokens"]) - 1 if v == "last" else v) for k, v in POSTS[path]["good"].items()}
    fields = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in good.items() if k != name] + [f'"{name}": {value}']
    raw = ("{" + ", ".join(fields) + "}").encode()
    status, body = call(playground.url + path.format(id=text["id"]), "POST", raw=raw)
    assert status == 400, (raw, body)
    line = body["error"]
    assert line.startswith(f"{name} must be {kind}, not ") and BAD[value] in line and "\n" not in line, (raw, line)


def test_a_prompt_of_null_is_not_the_string_none(playground):
    for prompt in ("null", "123", '["a"]'):
        status, body = call(f"{playground.url}/api/texts", "POST", raw=b'{"prompt": %s}' % prompt.encode())
        assert status == 400 and body["error"].startswith("prompt must be a string"), body


def test_an_infinite_seed_is_a_bad_field_not_a_store_error(playground):
    status, body = call(f"{playground.url}/api/texts", "POST", raw=b'{"prompt": "hi", "seed": 1e400}')
    assert status == 400 and body["error"] == "seed must be a whole number, not infinity", body


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"prompt": "hi", "seed": -1}, "seed must be 0 or more"),
        ({"prompt": "hi", "temperature": -1}, "temperature must be 0 (greedy) or a positive number"),
        ({"prompt": "hi", "top_k": 0}, "top_k 0 must be between 1 and the vocabulary size"),
    ],
)
def test_errors_name_the_json_field_not_the_cli_flag(playground, body, words):
    status, answer = call(f"{playground.url}/api/texts", "POST", body)
    assert status == 400 and words in answer["error"] and "--" not in answer["error"], answer


def test_query_numbers_are_finite_whole_numbers(playground, text):
    url = f"{playground.url}/api/texts/{text['id']}"
    for query, words in (("n=1e400", "n must be a whole number, not '1e400'"), ("n=-1", "n must be 0 or more")):
        status, body = call(f"{url}/generate?{query}")
        assert status == 400 and words in body["error"] and "--" not in body["error"], body
    status, body = call(f"{playground.url}/api/attention-memory?heads=1e400")
    assert status == 400 and "heads must be a whole number" in body["error"], body


def test_good_values_still_work(playground, text):
    status, view = call(f"{playground.url}/api/texts", "POST", {"prompt": " the", "seed": 2.0, "model": None})
    assert status == 200 and view["settings"]["seed"] == 2, view
    call(f"{playground.url}/api/texts/{view['id']}", "DELETE")
    status, walked = call(f"{playground.url}/api/softmax-walk", "POST", {"scores": [1, 2.5, 3], "tile": 2})
    assert status == 200 and len(walked["weights"]) == 3, walked
