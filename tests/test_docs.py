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
