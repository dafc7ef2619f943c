"""README's Python example runs as written (on a store in a temporary folder)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_python_example_runs(tmp_path, monkeypatch):
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the configs' stores default to folders under it
    monkeypatch.chdir(README.parent)
    code = code.replace('api.generate_text("ROMEO:", n=20, on_text', 'api.generate_text("ROMEO:", n=2, on_text')
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["out"]["tokens"] and len(scope["text"].tokens) == 5 and len(scope["other"].tokens) == 5
