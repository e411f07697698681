"""worker drives the dsm Python package for the tests in tests/: one
command against one region of the dsmd at ADDR, printing its result.

    worker.py ADDR REGION write-arange COUNT            (numpy: arange(COUNT) * 1.5 as float64, then sync)
    worker.py ADDR REGION mutex-inc LOCKOFF N CNTOFF    (plain increments under the mutex)
    worker.py ADDR REGION hex OFF LEN
"""

import struct
import sys

import dsm


def main(addr, region, cmd, *args):
    c = dsm.connect(addr)
    r = c.map(region)
    if cmd == "write-arange":
        import numpy as np

        n = int(args[0])
        a = np.frombuffer(r, dtype=np.float64, count=n)
        a[:] = np.arange(n, dtype=np.float64) * 1.5
        r.sync()
        print("ok")
    elif cmd == "mutex-inc":
        lock, n, off = (int(x, 0) for x in args)
        m = r.mutex(lock)
        for _ in range(n):
            with m:
                (v,) = struct.unpack_from("<Q", r, off)
                struct.pack_into("<Q", r, off, v + 1)
        print("ok")
    elif cmd == "hex":
        off, n = (int(x, 0) for x in args)
        print(bytes(memoryview(r)[off : off + n]).hex())
    else:
        sys.exit("worker: unknown command %s" % cmd)
    r.close()
    c.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
