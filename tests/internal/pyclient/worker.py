"""worker drives the dsm Python package for the tests in tests/: one
command against one region of the dsmd at ADDR, printing its result.

    worker.py ADDR REGION write-arange COUNT            (numpy: arange(COUNT) * 1.5 as float64, then sync)
    worker.py ADDR REGION mutex-inc LOCKOFF N CNTOFF    (plain increments under the mutex)
    worker.py ADDR REGION hex OFF LEN
    worker.py ADDR REGION barrier-loop OFF PARTIES N CNTOFF
                                                        (N times: add 1 at CNTOFF, wait, check that
                                                         every party's addition is there)
    worker.py ADDR REGION barrier-twice OFF PARTIES     (wait twice: "passed GEN" or
                                                         "broken session 0x.." for each)
    worker.py ADDR REGION sem-check OFF CAP CNTOFF N [MAXOFF]
                                                        (N times: acquire 1, count the holders inside
                                                         at CNTOFF, fail above CAP, keep the most
                                                         seen at MAXOFF, release)
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
    elif cmd == "barrier-loop":
        off, parties, n, cnt = (int(x, 0) for x in args)
        b = r.barrier(off, parties)
        for _ in range(n):
            r.add_u64(cnt, 1)
            gen = b.wait()
            got = r.load_u64(cnt)
            if got < parties * (gen + 1):
                sys.exit("worker: generation %d passed with %d arrivals counted" % (gen, got))
        print("ok")
    elif cmd == "barrier-twice":
        off, parties = (int(x, 0) for x in args)
        b = r.barrier(off, parties)
        for _ in range(2):
            try:
                print("passed %d" % b.wait(), flush=True)
            except dsm.BarrierBrokenError as e:
                print("broken session %#x" % e.session if e.session else "broken", flush=True)
    elif cmd == "sem-check":
        off, cap, cnt, n = (int(x, 0) for x in args[:4])
        most = int(args[4], 0) if len(args) > 4 else None
        s = r.semaphore(off, cap)
        for _ in range(n):
            with s:
                inside = r.add_u64(cnt, 1)
                if inside > cap:
                    sys.exit("worker: %d holders inside a semaphore of %d" % (inside, cap))
                if most is not None:
                    while True:
                        m = r.load_u64(most)
                        if m >= inside or r.cas_u64(most, m, inside):
                            break
                r.add_u64(cnt, -1)
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
