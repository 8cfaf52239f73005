"""Every ``>>>`` example of docs/*.md runs and prints what the page says (doctest)."""

import doctest
from pathlib import Path

import pytest

DOCS = Path(__file__).parent.parent / "docs"
PAGES = sorted(DOCS.glob("*.md"))


def test_the_pages_exist():
    names = {p.name for p in PAGES}
    assert {"README.md", "pipeline.md", "stages.md", "conventions.md", "extending.md",
            "testing.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_doc_examples(page, monkeypatch):
    for var in ("TEXPR_PRINT_PASSES", "TEXPR_VERIFY"):
        monkeypatch.delenv(var, raising=False)
    result = doctest.testfile(str(page), module_relative=False, report=True,
                              optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{page.name}: {result.failed} of {result.attempted} failed"
    assert result.attempted > 0, f"{page.name} has no example"


def test_links_between_pages_resolve():
    import re

    for page in PAGES:
        for target in re.findall(r"\]\(([\w.-]+\.md)\)", page.read_text()):
            assert (DOCS / target).exists(), f"{page.name} links to missing {target}"


def _modules():
    import importlib
    import pkgutil

    import texpr
    from texpr import codegen, simplify

    names = ["texpr", "texpr.simplify", "texpr.codegen"]
    for pkg in (texpr, simplify, codegen):  # the subpackages live in folders of their own
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    return [importlib.import_module(n) for n in sorted(set(names))
            if not n.startswith("texpr.examples")]


def test_docstring_examples():
    attempted = 0
    for module in _modules():
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0, f"{module.__name__}: {result.failed} failed"
        attempted += result.attempted
    assert attempted >= 20
    assert {"texpr.simplify.pipeline", "texpr.codegen.loopnest.lower"} <= {m.__name__ for m in _modules()}
