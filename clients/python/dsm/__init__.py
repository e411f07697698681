"""Python client of the DSM service: cluster-wide shared memory regions.

A region mapped with Client.map is a buffer: memoryview(region) and
numpy.frombuffer(region, dtype=...) see the mapping itself, with no copy;
plain loads and stores through them are coherent across the cluster, and
processes on one machine share the same pages. This package is a ctypes
binding of libdsm (the C client), found through $DSM_LIBRARY, else the
loader path.

    import dsm, numpy as np
    c = dsm.connect()                 # $DSM_ADDR, else /run/dsm/dsmd.sock
    c.create("feat", 1 << 20)
    r = c.map("feat")
    a = np.frombuffer(r, dtype=np.float64)
    a[:4] = [1, 2, 3, 4]
    r.sync()

Arrays and memoryviews made from a region keep it alive; after an
explicit Region.close() they must no longer be used (the memory is
unmapped).
"""

import ctypes
import ctypes.util
import errno as _errno
import math
import os

__all__ = [
    "connect",
    "Client",
    "Region",
    "Mutex",
    "Semaphore",
    "Barrier",
    "DSMError",
    "OwnerDiedError",
    "BarrierBrokenError",
    "DSMTimeoutError",
    "MUTEX_SIZE",
    "SEMAPHORE_SIZE",
    "SEMAPHORE_MAX",
    "SEMAPHORE_HOLDERS",
    "BARRIER_SIZE",
    "BARRIER_MAX_PARTIES",
]

#: Bytes of region memory a Mutex uses.
MUTEX_SIZE = 80
#: Bytes of region memory a Semaphore uses; its largest capacity; how many
#: mappings can hold units of one at a time.
SEMAPHORE_SIZE = 224
SEMAPHORE_MAX = (1 << 22) - 1
SEMAPHORE_HOLDERS = 16
#: Bytes of region memory a Barrier uses; its largest number of parties.
BARRIER_SIZE = 544
BARRIER_MAX_PARTIES = 64


def _load():
    path = os.environ.get("DSM_LIBRARY")
    if path:
        return ctypes.CDLL(path, use_errno=True)
    name = ctypes.util.find_library("dsm")
    try:
        return ctypes.CDLL(name or "libdsm.so", use_errno=True)
    except OSError as e:
        raise ImportError(
            "dsm: libdsm not found: install it (make install-clients PREFIX=...) "
            "where the loader finds it, or set DSM_LIBRARY to its path (%s)" % e
        ) from e


_lib = _load()
_P = ctypes.c_void_p
_U64 = ctypes.c_uint64
_sigs = {
    "dsm_connect": (_P, [ctypes.c_char_p]),
    "dsm_close": (None, [_P]),
    "dsm_create_ex": (ctypes.c_int, [_P, ctypes.c_char_p, _U64, ctypes.c_uint32, ctypes.c_int]),
    "dsm_delete_ex": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_int]),
    "dsm_region_size": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(_U64)]),
    "dsm_map": (_P, [_P, ctypes.c_char_p]),
    "dsm_map_ex": (_P, [_P, ctypes.c_char_p, ctypes.c_uint32]),
    "dsm_unavailable": (ctypes.c_int, [_P, ctypes.POINTER(_U64), ctypes.c_int]),
    "dsm_unavailable_why": (ctypes.c_int, [_P, _U64, ctypes.c_char_p, ctypes.c_size_t]),
    "dsm_addr": (_P, [_P]),
    "dsm_len": (_U64, [_P]),
    "dsm_page_size": (_U64, [_P]),
    "dsm_session": (_U64, [_P]),
    "dsm_region_err": (ctypes.c_int, [_P]),
    "dsm_load_u64": (ctypes.c_int, [_P, _U64, ctypes.POINTER(_U64)]),
    "dsm_store_u64": (ctypes.c_int, [_P, _U64, _U64]),
    "dsm_add_u64": (ctypes.c_int, [_P, _U64, _U64, ctypes.POINTER(_U64)]),
    "dsm_cas_u64": (ctypes.c_int, [_P, _U64, _U64, _U64]),
    "dsm_sync": (ctypes.c_int, [_P]),
    "dsm_unmap": (ctypes.c_int, [_P]),
    "dsm_mutex_new": (_P, [_P, _U64]),
    "dsm_mutex_lock": (ctypes.c_int, [_P]),
    "dsm_mutex_timedlock": (ctypes.c_int, [_P, ctypes.c_int64]),
    "dsm_mutex_trylock": (ctypes.c_int, [_P]),
    "dsm_mutex_unlock": (ctypes.c_int, [_P]),
    "dsm_mutex_free": (None, [_P]),
    "dsm_sem_acquire": (ctypes.c_int, [_P, _U64, _U64, _U64]),
    "dsm_sem_timedacquire": (ctypes.c_int, [_P, _U64, _U64, _U64, ctypes.c_int64]),
    "dsm_sem_tryacquire": (ctypes.c_int, [_P, _U64, _U64, _U64]),
    "dsm_sem_release": (ctypes.c_int, [_P, _U64, _U64, _U64]),
    "dsm_sem_available": (ctypes.c_int, [_P, _U64, _U64, ctypes.POINTER(_U64)]),
    "dsm_barrier_new": (_P, [_P, _U64, ctypes.c_uint]),
    "dsm_barrier_wait": (ctypes.c_int, [_P]),
    "dsm_barrier_timedwait": (ctypes.c_int, [_P, ctypes.c_int64]),
    "dsm_barrier_broken_by": (_U64, [_P]),
    "dsm_barrier_reset": (ctypes.c_int, [_P]),
    "dsm_barrier_generation": (ctypes.c_int, [_P, ctypes.POINTER(_U64)]),
    "dsm_barrier_free": (None, [_P]),
    "dsm_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "dsm_last_error": (ctypes.c_char_p, []),
}
for _name, (_res, _args) in _sigs.items():
    _f = getattr(_lib, _name)
    _f.restype, _f.argtypes = _res, _args


class DSMError(OSError):
    """A failed call: errno is the error code, strerror libdsm's name for
    it, and detail dsmd's own explanation when it gave one."""

    def __init__(self, code, op, detail=""):
        code = abs(code)
        msg = _lib.dsm_strerror(code).decode()
        if detail:
            msg = "%s: %s" % (msg, detail)
        super().__init__(code, "%s: %s" % (op, msg))
        self.detail = detail


class OwnerDiedError(DSMError):
    """Mutex.lock acquired the lock, but its previous holder died holding
    it: the data it protects may be half updated. The lock is held."""


class BarrierBrokenError(DSMError):
    """Barrier.wait on a broken barrier (a party died, or a reset ended the
    generation it waited in). session is the token of the dead party that
    broke it, or 0 when none is named."""

    def __init__(self, code, op, detail="", session=0):
        super().__init__(code, op, detail)
        self.session = session


class DSMTimeoutError(DSMError, TimeoutError):
    """A wait with a timeout gave up (it holds nothing, and a barrier
    arrival is withdrawn)."""


def _check(rc, op):
    if rc < 0:
        detail = _lib.dsm_last_error().decode(errors="replace")
        if -rc == _errno.EOWNERDEAD:
            raise OwnerDiedError(rc, op, detail)
        if -rc == _errno.ETIMEDOUT:
            raise DSMTimeoutError(rc, op, detail)
        raise DSMError(rc, op, detail)
    return rc


def _timeout_ns(timeout):
    if timeout is None:
        return -1
    return max(0, int(timeout * 1e9))


def _name(name):
    if not isinstance(name, str) or not name:
        raise ValueError("a region name is a non-empty str")
    return name.encode()


def connect(addr=None):
    """Connect to the local dsmd: addr is its socket (the mapping socket,
    or the gRPC socket with map.sock beside it); None means $DSM_ADDR,
    else /run/dsm/dsmd.sock."""
    return Client(addr)


class Client:
    """A client of the local dsmd. Regions it maps outlive it."""

    def __init__(self, addr=None):
        p = _lib.dsm_connect(addr.encode() if addr else None)
        if not p:
            e = ctypes.get_errno()
            raise DSMError(e, "connect %s" % (addr or "(default)"), _lib.dsm_last_error().decode(errors="replace"))
        self._p = p

    def _ptr(self):
        if not self._p:
            raise ValueError("dsm: client closed")
        return self._p

    def create(self, name, size, page_size=0, durable=False):
        """Create region name of size bytes; a region of that name and spec
        already there is not an error (idempotent), one of another is."""
        _check(_lib.dsm_create_ex(self._ptr(), _name(name), size, page_size, 1 if durable else 0), "create %s" % name)

    def delete(self, name, force=False):
        """Delete region name; without force, refused while it is mapped."""
        _check(_lib.dsm_delete_ex(self._ptr(), _name(name), 1 if force else 0), "delete %s" % name)

    def size(self, name):
        """The size of region name in bytes."""
        v = _U64()
        _check(_lib.dsm_region_size(self._ptr(), _name(name), ctypes.byref(v)), "look up %s" % name)
        return v.value

    def map(self, name, fault_timeout=None):
        """Map region name: a Region, which is a writable buffer.

        fault_timeout (seconds; None or 0: wait forever, as dsm_map) is
        libdsm's dsm_map_ex: dsmd gives up on a fault that waits longer
        than that for a page the cluster cannot serve. The atomics then
        raise DSMError with errno EHOSTUNREACH naming the page and why,
        and Region.unavailable() lists the page; an access through the
        buffer (numpy included) gets SIGBUS, which ends the interpreter."""
        ms = 0
        if fault_timeout:
            if fault_timeout < 0:
                raise ValueError("dsm: a negative fault timeout")
            ms = min(max(1, int(math.ceil(fault_timeout * 1000))), 2**32 - 1)
        p = _lib.dsm_map_ex(self._ptr(), _name(name), ms)
        if not p:
            e = ctypes.get_errno()
            raise DSMError(e, "map %s" % name, _lib.dsm_last_error().decode(errors="replace"))
        n = _lib.dsm_len(p)
        cls = type("Region", (Region, ctypes.c_ubyte * n), {})
        r = cls.from_address(_lib.dsm_addr(p))
        r._p, r._name = p, name
        return r

    def close(self):
        if self._p:
            _lib.dsm_close(self._p)
            self._p = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Region:
    """A mapped region: a ctypes array of its bytes over the mapping, so a
    buffer (memoryview, numpy.frombuffer) with no copy. Made by
    Client.map."""

    _p = None
    _name = ""

    def _ptr(self):
        if not self._p:
            raise ValueError("dsm: region closed")
        return self._p

    @property
    def name(self):
        return self._name

    @property
    def page_size(self):
        return _lib.dsm_page_size(self._ptr())

    @property
    def session(self):
        """dsmd's token of this mapping (0: none)."""
        return _lib.dsm_session(self._ptr())

    def view(self):
        """A memoryview of the mapping with format "B". memoryview(region)
        has ctypes' format "<B", which slice assignment from bytes does not
        take (region[i:j] = b"..." does)."""
        return memoryview(self).cast("B")

    def unavailable(self):
        """The pages dsmd has poisoned in this mapping now (see
        Client.map's fault_timeout), as a sorted list of (page, why):
        page is the offset divided by page_size, why dsmd's reason."""
        n = 64
        while True:
            pages = (_U64 * n)()
            got = _check(_lib.dsm_unavailable(self._ptr(), pages, n), "unavailable %s" % self._name)
            if got <= n:
                break
            n = got
        out = []
        why = ctypes.create_string_buffer(1100)
        for page in pages[:got]:
            if _lib.dsm_unavailable_why(self._p, page, why, len(why)) == 1:
                out.append((page, why.value.decode(errors="replace")))
        return out

    def err(self):
        """None while dsmd serves the mapping, else the DSMError saying why not."""
        rc = _lib.dsm_region_err(self._ptr())
        return DSMError(rc, "region %s" % self._name) if rc else None

    def load_u64(self, off):
        v = _U64()
        _check(_lib.dsm_load_u64(self._ptr(), off, ctypes.byref(v)), "load %s@%d" % (self._name, off))
        return v.value

    def store_u64(self, off, value):
        _check(_lib.dsm_store_u64(self._ptr(), off, value), "store %s@%d" % (self._name, off))

    def add_u64(self, off, delta):
        """Add delta (mod 2**64) to the word at off; the new value."""
        v = _U64()
        _check(_lib.dsm_add_u64(self._ptr(), off, delta & (2**64 - 1), ctypes.byref(v)), "add %s@%d" % (self._name, off))
        return v.value

    def cas_u64(self, off, old, new):
        """Set the word at off to new if it holds old; whether it did."""
        return _check(_lib.dsm_cas_u64(self._ptr(), off, old, new), "cas %s@%d" % (self._name, off)) == 1

    def sync(self):
        """Write back what this node holds modified (like msync)."""
        _check(_lib.dsm_sync(self._ptr()), "sync %s" % self._name)

    def mutex(self, off):
        """The Mutex at off (MUTEX_SIZE bytes, 8-byte aligned), the same
        lock as the Go and C libraries' at that offset."""
        return Mutex(self, off)

    def semaphore(self, off, capacity):
        """The Semaphore of capacity units at off (SEMAPHORE_SIZE bytes,
        8-byte aligned), the same as the Go and C libraries' there."""
        return Semaphore(self, off, capacity)

    def barrier(self, off, parties):
        """A party of the Barrier of parties parties at off (BARRIER_SIZE
        bytes, 8-byte aligned), the same as the Go and C libraries' there."""
        return Barrier(self, off, parties)

    def close(self):
        """Unmap. Views of the region must no longer be used."""
        if self._p:
            p, self._p = self._p, None
            _check(_lib.dsm_unmap(p), "unmap %s" % self._name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return "<dsm.Region %r, %d bytes>" % (self._name, len(self))


class Mutex:
    """The cluster-wide mutex at an offset of a region (see dsm.h and the Go
    library's dsm.Mutex). lock raises OwnerDiedError, with the lock held,
    when the previous holder died holding it; used as a context manager,
    that case sets owner_died and enters."""

    def __init__(self, region, off):
        p = _lib.dsm_mutex_new(region._ptr(), off)
        if not p:
            raise DSMError(ctypes.get_errno(), "mutex at %d" % off)
        self._region, self._p, self.owner_died = region, p, False

    def lock(self, timeout=None):
        """Take the lock, waiting for it (at most timeout seconds, when
        given: False if it gave up, leaving its place in the line)."""
        if timeout is None:
            _check(_lib.dsm_mutex_lock(self._p), "lock")
            return True
        try:
            _check(_lib.dsm_mutex_timedlock(self._p, _timeout_ns(timeout)), "lock")
        except DSMTimeoutError:
            return False
        return True

    def trylock(self):
        """Take the lock if it is free now; whether it did."""
        return _check(_lib.dsm_mutex_trylock(self._p), "trylock") == 1

    def unlock(self):
        _check(_lib.dsm_mutex_unlock(self._p), "unlock")

    def __enter__(self):
        try:
            self.lock()
            self.owner_died = False
        except OwnerDiedError:
            self.owner_died = True
        return self

    def __exit__(self, *exc):
        self.unlock()

    def __del__(self):
        if self._p:
            _lib.dsm_mutex_free(self._p)
            self._p = None


class Semaphore:
    """The cluster-wide counting semaphore at an offset of a region (see
    dsm.h and the Go library's dsm.Semaphore): fair (FIFO), its units held
    by the mapping, those of a holder that dies given back. Used as a
    context manager, it acquires and releases one unit."""

    def __init__(self, region, off, capacity):
        region._ptr()
        self._region, self.off, self.capacity = region, off, capacity

    def _op(self, what):
        return "%s semaphore %s@%d" % (what, self._region.name, self.off)

    def acquire(self, n=1, blocking=True, timeout=None):
        """Take n units, waiting for them (at most timeout seconds, when
        given) unless blocking is false; whether they were taken."""
        r = self._region._ptr()
        if not blocking:
            return self.try_acquire(n)
        if timeout is None:
            _check(_lib.dsm_sem_acquire(r, self.off, self.capacity, n), self._op("acquire"))
            return True
        try:
            _check(_lib.dsm_sem_timedacquire(r, self.off, self.capacity, n, _timeout_ns(timeout)), self._op("acquire"))
        except DSMTimeoutError:
            return False
        return True

    def try_acquire(self, n=1):
        """Take n units if they are free now and nobody waits ahead."""
        return _check(_lib.dsm_sem_tryacquire(self._region._ptr(), self.off, self.capacity, n), self._op("try-acquire")) == 1

    def release(self, n=1):
        """Give back n units this mapping holds (DSMError EPERM if fewer)."""
        _check(_lib.dsm_sem_release(self._region._ptr(), self.off, self.capacity, n), self._op("release"))

    def available(self):
        """The units free now (a dead holder's count as held until taken back)."""
        v = _U64()
        _check(_lib.dsm_sem_available(self._region._ptr(), self.off, self.capacity, ctypes.byref(v)), self._op("available"))
        return v.value

    def __enter__(self):
        self.acquire(1)
        return self

    def __exit__(self, *exc):
        self.release(1)


class Barrier:
    """One party of the cluster-wide barrier at an offset of a region (see
    dsm.h and the Go library's dsm.Barrier). wait returns the generation
    passed; it raises BarrierBrokenError when a party died (its session
    named) or a reset ended the generation, until reset is called."""

    _p = None

    def __init__(self, region, off, parties):
        p = _lib.dsm_barrier_new(region._ptr(), off, parties)
        if not p:
            raise DSMError(ctypes.get_errno(), "barrier at %d" % off, _lib.dsm_last_error().decode(errors="replace"))
        self._region, self._p, self.off, self.parties = region, p, off, parties

    def _op(self, what):
        return "%s barrier %s@%d" % (what, self._region.name, self.off)

    def wait(self, timeout=None):
        """Arrive and wait for every party (at most timeout seconds, when
        given: then DSMTimeoutError, the arrival withdrawn); the generation."""
        self._region._ptr()
        if timeout is None:
            rc = _lib.dsm_barrier_wait(self._p)
        else:
            rc = _lib.dsm_barrier_timedwait(self._p, _timeout_ns(timeout))
        if rc == -_errno.EPIPE:
            detail = _lib.dsm_last_error().decode(errors="replace")
            raise BarrierBrokenError(rc, self._op("wait"), detail, _lib.dsm_barrier_broken_by(self._p))
        return _check(rc, self._op("wait"))

    def reset(self):
        """Start a new generation, not broken, freeing dead parties' words."""
        self._region._ptr()
        _check(_lib.dsm_barrier_reset(self._p), self._op("reset"))

    @property
    def generation(self):
        """The generation now waited for."""
        return self.state()[0]

    @property
    def broken(self):
        return self.state()[1]

    def state(self):
        """(generation now waited for, whether the barrier is broken)."""
        self._region._ptr()
        g = _U64()
        b = _check(_lib.dsm_barrier_generation(self._p, ctypes.byref(g)), self._op("read"))
        return g.value, b == 1

    def __del__(self):
        if self._p:
            _lib.dsm_barrier_free(self._p)
            self._p = None
