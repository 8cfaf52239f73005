"""The README's Python snippets run as written (in order, one namespace), and the
tour's ``simplify.explain(dW)`` prints the iteration counts of every pass."""

import contextlib
import io
import re
from pathlib import Path

import numpy as np

from texpr.simplify import PIPELINE


def _run_readme():
    text = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    namespace, out = {}, io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(compile(block, "README.md", "exec"), namespace)
    return namespace, out.getvalue()


def test_readme_python_blocks_run():
    namespace, printed = _run_readme()
    assert namespace["dw"].shape == (3, 5)
    # the reductions' snippet: a where= prefix sum and a tuple argmax
    x, p, v, at = (namespace[n] for n in ("x", "p", "v", "at"))
    np.testing.assert_allclose(p, [x[i, :i + 1].sum() for i in range(4)], rtol=1e-6)
    np.testing.assert_array_equal(at, x.argmax(axis=1))
    np.testing.assert_array_equal(v, x.max(axis=1))
    # the tour's explain: one line per pass of the first round, with counts
    rows = re.findall(r"^  round 1 (\w+)\s+(?:([\d,]+) ->\s+([\d,]+)|=)$", printed, flags=re.M)
    assert [name for name, _b, _a in rows] == [p.__name__ for p in PIPELINE]
    counts = [(int(b.replace(",", "")), int(a.replace(",", ""))) for _n, b, a in rows if b]
    # raw dW -> simplified: Y (60 points), the head 2 * Y (12: stored, the GEMM of dW
    # re-reads it at every k, docs/stages.md) and dW (60)
    assert counts and counts[0][0] == 1104 and counts[-1][1] == 132
    assert "round 1: no pass changed the graph" not in printed
    assert "final: iteration count 132" in printed
