"""Tests of the dsm package against a running dsmd: $DSM_ADDR names its
socket (tests/ in the repository runs them against a cluster it starts);
without it they are skipped. $DSM_TEST_PREFIX, when set, prefixes the
region names."""

import ctypes
import os
import threading
import time
import uuid

import pytest

if not os.environ.get("DSM_ADDR"):
    pytest.skip("DSM_ADDR is not set: no dsmd to test against", allow_module_level=True)

import dsm  # noqa: E402


def region_name(what):
    return "%spy-%s-%s" % (os.environ.get("DSM_TEST_PREFIX", ""), what, uuid.uuid4().hex[:8])


@pytest.fixture
def client():
    c = dsm.connect()
    yield c
    c.close()


@pytest.fixture
def region(client):
    name = region_name("r")
    client.create(name, 1 << 16)
    r = client.map(name)
    yield r
    r.close()
    client.delete(name)


def test_create_is_idempotent(client):
    name = region_name("idem")
    client.create(name, 8192)
    client.create(name, 8192)
    assert client.size(name) == 8192
    with pytest.raises(dsm.DSMError) as e:
        client.create(name, 16384)
    assert e.value.errno == 17  # EEXIST
    client.delete(name)
    with pytest.raises(dsm.DSMError) as e:
        client.size(name)
    assert e.value.errno == 2  # ENOENT


def test_buffer_protocol(region):
    m = memoryview(region)
    assert m.nbytes == len(region) == 1 << 16
    assert not m.readonly
    assert m.format in ("B", "<B")
    region[100:105] = b"hello"
    assert bytes(m[100:105]) == b"hello"
    v = region.view()
    assert v.format == "B"
    v[200:203] = b"abc"
    assert bytes(region[200:203]) == b"abc"


def test_numpy_zero_copy(region):
    np = pytest.importorskip("numpy")
    a = np.frombuffer(region, dtype=np.float64)
    assert a.size == (1 << 16) // 8
    a[:4] = [1.5, 2.5, 3.5, 4.5]
    b = np.frombuffer(region, dtype=np.float64)
    assert list(b[:4]) == [1.5, 2.5, 3.5, 4.5]
    # The same memory: the array's data is the mapping.
    assert a.ctypes.data == ctypes.addressof(region)
    assert np.shares_memory(a, b)
    region.store_u64(4096, 7)
    assert np.frombuffer(region, dtype=np.uint64)[512] == 7


def test_atomics(region):
    assert region.add_u64(8, 5) == 5
    assert region.add_u64(8, 2**64 - 1) == 4  # wraps: -1
    assert region.load_u64(8) == 4
    assert region.cas_u64(8, 4, 9)
    assert not region.cas_u64(8, 4, 10)
    region.store_u64(8, 11)
    assert region.load_u64(8) == 11
    with pytest.raises(dsm.DSMError) as e:
        region.load_u64(3)  # unaligned
    assert e.value.errno == 22
    region.sync()


def test_mutex(region):
    m = region.mutex(256)
    with m:
        assert not m.owner_died
        assert not region.mutex(256).trylock()
    assert m.trylock()
    m.unlock()
    with pytest.raises(dsm.DSMError):
        m.unlock()


def test_mutex_timeout(region):
    m, other = region.mutex(256), region.mutex(256)
    assert m.lock()
    assert not other.lock(timeout=0.05)  # gives its ticket up
    m.unlock()  # passes the given-up ticket
    assert other.lock(timeout=5)
    other.unlock()


def test_semaphore(region):
    s = region.semaphore(1024, 2)
    assert s.available() == 2
    assert s.acquire()
    assert s.try_acquire()
    assert s.available() == 0
    assert not s.try_acquire()
    assert not s.acquire(timeout=0.05)
    s.release(2)
    assert s.available() == 2
    with pytest.raises(dsm.DSMError) as e:
        s.release()  # none held
    assert e.value.errno == 1  # EPERM
    with s:
        assert s.available() == 1
        # The units are the mapping's: another value sees them.
        assert region.semaphore(1024, 2).available() == 1
    assert s.available() == 2
    with pytest.raises(dsm.DSMError) as e:
        region.semaphore(1024, 3).acquire()  # made with 2
    assert e.value.errno == 22


def test_semaphore_waits_for_release(region):
    s = region.semaphore(1024, 1)
    s.acquire()
    got = []
    t = threading.Thread(target=lambda: got.append(s.acquire(timeout=10)))
    t.start()
    time.sleep(0.1)
    assert not got  # still waiting
    s.release()
    t.join()
    assert got == [True]
    s.release()


def test_barrier(region):
    one = region.barrier(2048, 1)
    assert [one.wait() for _ in range(3)] == [0, 1, 2]

    a, b = region.barrier(4096, 2), region.barrier(4096, 2)
    gens = []

    def party(p, n):
        for _ in range(n):
            gens.append(p.wait(timeout=10))

    t = threading.Thread(target=party, args=(b, 2))
    t.start()
    party(a, 2)
    t.join()
    assert sorted(gens) == [0, 0, 1, 1]

    # A wait that times out withdraws its arrival.
    with pytest.raises(dsm.DSMTimeoutError):
        a.wait(timeout=0.05)
    assert a.state() == (2, False)

    # Reset moves two generations on.
    a.reset()
    assert a.generation == 4 and not a.broken
    t = threading.Thread(target=party, args=(b, 1))
    t.start()
    party(a, 1)
    t.join()
    assert gens[-2:] == [4, 4]

    with pytest.raises(dsm.DSMError) as e:
        region.barrier(4096, 3).wait()  # made with 2
    assert e.value.errno == 22
    with pytest.raises(dsm.DSMError):
        region.barrier(4096, 65)


def test_delete_refused_while_mapped(client, region):
    with pytest.raises(dsm.DSMError) as e:
        client.delete(region.name)
    assert e.value.errno == 16  # EBUSY


def test_unknown_region(client):
    with pytest.raises(dsm.DSMError) as e:
        client.map(region_name("none"))
    assert e.value.errno == 2


def test_map_with_fault_timeout(client):
    name = region_name("ft")
    client.create(name, 1 << 16)
    r = client.map(name, fault_timeout=2.5)
    try:
        assert r.unavailable() == []
        r.store_u64(4096, 42)
        assert r.load_u64(4096) == 42
        r[0:3] = b"abc"
        assert bytes(r[0:3]) == b"abc"
    finally:
        r.close()
    with pytest.raises(ValueError):
        client.map(name, fault_timeout=-1)
    client.delete(name)
