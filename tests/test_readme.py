"""README's Python example runs as written (on a store in a temporary folder); README and docs/ stay short and every
relative link in them points to a file that exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def test_the_python_example_runs(tmp_path, monkeypatch):
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the configs' stores default to folders under it
    monkeypatch.chdir(ROOT)
    code = code.replace('api.generate_text("ROMEO:", n=20,', 'api.generate_text("ROMEO:", n=2,')
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["out"]["tokens"] and len(scope["text"].tokens) == 5 and len(scope["other"].tokens) == 5


def test_readme_and_each_docs_page_stay_short():
    assert len(README.read_bytes()) <= 10_000
    for page in (ROOT / "docs").glob("*.md"):
        assert len(page.read_bytes()) <= 16_000, page.name


def test_every_relative_link_points_to_a_file():
    missing = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the page itself
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing


def test_the_link_check_sees_links():
    found = LINK.findall("see [a](docs/a.md#x), ![b](img/b.png) and [c](https://example.org)")
    assert found == ["docs/a.md#x", "img/b.png", "https://example.org"]
