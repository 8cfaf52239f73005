"""A tiny program for the kernel-cache tests, run in a subprocess:

    python cache_prog.py FIRST [COUNT]

builds COUNT (default 1) kernels ``Y[i, j] = X[i, j] * c + W[j]`` with
``c = FIRST, FIRST + 1, ...`` (distinct constants: distinct cache entries), runs
each, and prints one JSON line: ``err`` (the largest error against numpy, NaN
if any value is NaN), ``disk`` (from_disk_cache of each kernel), ``paths``,
``warnings`` (the messages of the CacheWarnings issued).
"""

import json
import math
import sys
import warnings

import numpy as np

import texpr as te
from texpr import codegen


def main(first, count):
    X = te.placeholder((3, 4), "X", "float64")
    W = te.placeholder((4,), "W", "float64")
    x = np.arange(12.0).reshape(3, 4)
    w = np.array([0.5, -1.0, 2.0, 3.0])
    err, disk, paths = 0.0, [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for c in range(first, first + count):
            Y = te.compute((3, 4), lambda i, j: X[i, j] * float(c) + W[j], name="Y")
            k = codegen.build([Y], [X, W])
            (y,) = k(x, w)
            e = float(np.max(np.abs(y - (x * c + w))))
            err = math.nan if math.isnan(e) or math.isnan(err) else max(err, e)
            disk.append(k.from_disk_cache)
            paths.append(k.path)
    msgs = [str(m.message) for m in caught if issubclass(m.category, codegen.CacheWarning)]
    print(json.dumps(dict(err=err, disk=disk, paths=paths, warnings=msgs)))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1)
