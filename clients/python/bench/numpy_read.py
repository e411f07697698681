"""numpy_read compares reading a numpy array over a region with reading a
local numpy array (docs/benchmarks.md). It creates and deletes the region
"npbench" (8 MiB) on the dsmd that $DSM_ADDR names; the region's pages are
all held here once written, so what it measures is the mapping, not misses.

    DSM_ADDR=.run/n1/dsmd.sock python3 clients/python/bench/numpy_read.py
"""
import time

import numpy as np

import dsm

c = dsm.connect()
n = 8 << 20
c.create("npbench", n)
r = c.map("npbench")
a = np.frombuffer(r, dtype=np.float64)
a[:] = 1.0            # faults every page in for writing
local = np.ones(n // 8)
def best(f, k=7):
    ts = []
    for _ in range(k):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[k // 2]
tr, tl = best(lambda: a.sum()), best(lambda: local.sum())
print("numpy sum of 8 MiB: region %.3f ms (%.2f GB/s), local %.3f ms (%.2f GB/s), ratio %.2f" % (tr*1e3, n/tr/1e9, tl*1e3, n/tl/1e9, tr/tl))
def loop(x):
    s = 0.0
    for i in range(0, 100000): s += x[i]
tr, tl = best(lambda: loop(a), 3), best(lambda: loop(local), 3)
print("python loop of 100000 element reads: region %.1f ms, local %.1f ms, ratio %.2f" % (tr*1e3, tl*1e3, tr/tl))
del a
r.close()
c.delete("npbench")
