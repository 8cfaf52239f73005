"""The README's Python snippets run as written (in order, one namespace)."""

import re
from pathlib import Path


def test_readme_python_blocks_run():
    text = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    namespace = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["dw"].shape == (3, 5)
