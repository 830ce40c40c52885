# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The result objects of ``Broker.acquire``'s common case (``_acquire.FastAcquire``), built
at the C level. Private.

:class:`Decision` and :class:`Lease` are the broker's frozen, slotted dataclasses, each
filled slot by slot by a :class:`_Maker` (at the offsets of the class's member descriptors;
its fields are checked against the lists below when the maker is made) instead of through
its ``__init__``; an :class:`Event` is a named tuple, allocated as one and filled item by
item. :class:`_Results` makes one broker's: a
``Decision``, the ``Lease`` of a grant from the engine's lease record (its placement from
the slots), and the ``expired`` events. Those are queued as fields (:class:`_ExpiredRun`, in
their place in the cursor's ``events``) and built when ``Broker.poll`` takes them
(``_Results.events``): an expiry then touches no Python object, and the events are built in
one loop that prefetches the campaign names. ``_results.pxd`` declares these for
``_acquire``, with the C helpers that read and set slots (``FastAcquire`` reads an
``Intent``'s fields with them).
"""

cimport numpy as cnp
from libc.stdint cimport int64_t
from cpython.list cimport PyList_New, PyList_SET_ITEM, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF
from libc.stdlib cimport realloc as c_realloc, free as c_free

from ._engine cimport ROW_MASK
from .admission import state as _state

cnp.import_array()

cdef extern from *:
    """
    #include "structmember.h"
    /* where a member descriptor keeps its object field (a __slots__ entry), or -1 */
    static Py_ssize_t bc_slot_offset(PyObject* descr) {
        PyMemberDef* m;
        if (Py_TYPE(descr) != &PyMemberDescr_Type)
            return -1;
        m = ((PyMemberDescrObject*)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset <= 0)
            return -1;
        return m->offset;
    }
    """
    Py_ssize_t bc_slot_offset(object descr)

cdef extern from *:
    void prefetch "__builtin_prefetch"(const void* p) noexcept nogil
    void prefetch_w "__builtin_prefetch"(const void* p, int rw) noexcept nogil

DEF PLACE_MAX = 64
DEF RUN_AHEAD = 8        # building events: prefetch the campaign name this many ahead

cdef tuple _STATE_NAMES = tuple(_state.LEASE_STATES)
# the fields the makers fill, in each dataclass's order (checked when a _Maker is made)
cdef tuple _DECISION_FIELDS = ("outcome", "intent_id", "campaign", "units", "lease", "path",
                               "reason", "retry_after", "cost", "wait", "seq")
cdef tuple _LEASE_FIELDS = ("id", "campaign", "dim", "units", "state", "firm", "service_class",
                            "granted_at", "start", "expiry", "cost", "revoke_at", "intent",
                            "placement", "slots")
cdef tuple _EVENT_FIELDS = ("kind", "time", "campaign", "lease_id", "intent_id", "deadline",
                            "reason", "units")


cdef int _slot_offsets(object cls, tuple names, Py_ssize_t* out) except -1:
    """The offsets of a slotted dataclass's fields, which must be ``names`` in this order."""
    import dataclasses
    if tuple(f.name for f in dataclasses.fields(cls)) != names or len(names) > MAKER_MAX:
        raise TypeError(f"{cls.__name__}: expected the fields {names}")
    cdef Py_ssize_t i, off
    for i, name in enumerate(names):
        off = bc_slot_offset(cls.__dict__.get(name))
        if off < 0:
            raise TypeError(f"{cls.__name__}.{name} is not a slot")
        out[i] = off
    return 0


cdef class _Maker:
    """Builds instances of a frozen, slotted dataclass without its ``__init__``: the object
    is allocated and its slots (all empty) set in place, at the offsets of the class's
    member descriptors, from values computed beforehand — no argument tuple and no
    ``object.__setattr__`` per field. Only for values that cannot form cycles (the object
    is untracked by the cycle collector)."""

    def __init__(self, cls, tuple names):
        _slot_offsets(cls, names, self.off)
        self.cls = cls


cdef class _ExpiredRun:
    """``expired`` events that ``FastAcquire._expire`` queued in the cursor's ``events``, built
    into :class:`Event` objects only when :meth:`Broker.poll` takes them
    (``FastAcquire.events``). Each is the fields its event needs, copied from the lease's
    row as it expired: by the time of the poll, the row can hold a later lease."""

    def __dealloc__(self):
        c_free(self.rec)

    def __len__(self):
        return self.n

    def __repr__(self):
        return f"<{self.n} expired events, built when polled>"

    cdef int reserve(self, Py_ssize_t m) except -1:
        """Room for ``m`` more events."""
        cdef Py_ssize_t cap = self.cap
        cdef int64_t* p
        if self.n + m <= cap:
            return 0
        cap = max(2 * cap, self.n + m, 64)
        p = <int64_t*>c_realloc(self.rec, cap * RUN_W * sizeof(int64_t))
        if p == NULL:
            raise MemoryError()
        self.rec = p
        self.cap = cap
        return 0


cdef class _Results:
    """One broker's result objects for ``FastAcquire``: its :class:`Decision`, :class:`Lease`
    dataclasses' makers, the ``expired`` :class:`Event` named tuple's class, and the names they carry (campaigns,
    dimensions, classes, nodes) as the broker holds them."""

    def __init__(self, port, Decision, Lease, Event):
        self.lease_view = port.lease
        self.Decision = _Maker(Decision, _DECISION_FIELDS)
        self.Lease = _Maker(Lease, _LEASE_FIELDS)
        if not issubclass(Event, tuple) or Event._fields != _EVENT_FIELDS:
            raise TypeError(f"Event: expected a named tuple of the fields {_EVENT_FIELDS}")
        self.Event = Event
        self.names, self.dims = port.names, list(port.dims)
        self.cls_names = list(port.class_names)
        self.node_of_slot, self.node_names = port.node_of_slot, port.node_names

    cdef object decision(self, object outcome, object iid, object name, object units,
                         object lease, object path, object reason, object retry,
                         object cost, object seq):
        cdef _Maker m = self.Decision
        cdef object o = m.new()
        m.put(o, 0, outcome)
        m.put(o, 1, iid)
        m.put(o, 2, name)
        m.put(o, 3, units)
        m.put(o, 4, lease)
        m.put(o, 5, path)
        m.put(o, 6, reason)
        m.put(o, 7, retry)
        m.put(o, 8, cost)
        m.put(o, 9, 0.0)
        m.put(o, 10, seq)
        return m.done(o)

    cdef object expired(self, object time, object name, object lid, object units):
        cdef object o = bc_alloc_n(self.Event, 8)
        bc_item(o, 0, "expired")
        bc_item(o, 1, time)
        bc_item(o, 2, name)
        bc_item(o, 3, lid)
        bc_item(o, 4, None)
        bc_item(o, 5, None)
        bc_item(o, 6, None)
        bc_item(o, 7, units)
        PyObject_GC_UnTrack(o)      # atoms only, as a _Maker's objects
        return o

    cdef list events(self, list ev):
        """``ev`` (the cursor's ``events``) with each run of expiries it holds replaced, where
        it stands, by their :class:`Event` objects: a new list (``ev`` itself if it holds
        none)."""
        cdef Py_ssize_t i, j, n = PyList_GET_SIZE(ev), total = 0, k = 0, nn
        cdef object x, o, tobj = None
        cdef _ExpiredRun run
        cdef const int64_t* q
        cdef int64_t tprev = 0, c
        cdef list out, names = self.names
        cdef bint runs = False
        for i in range(n):
            x = <object>PyList_GET_ITEM(ev, i)
            if type(x) is _ExpiredRun:
                total += (<_ExpiredRun>x).n
                runs = True
            else:
                total += 1
        if not runs:
            return ev
        out = PyList_New(total)
        nn = PyList_GET_SIZE(names)
        for i in range(n):
            x = <object>PyList_GET_ITEM(ev, i)
            if type(x) is not _ExpiredRun:
                Py_INCREF(x)
                PyList_SET_ITEM(out, k, x)
                k += 1
                continue
            run = <_ExpiredRun>x
            q = run.rec
            for j in range(run.n):
                # the name's refcount is a cache miss per event: start it early
                if j + RUN_AHEAD < run.n:
                    c = q[RUN_AHEAD * RUN_W + 1]
                    if 0 <= c < nn:
                        prefetch(PyList_GET_ITEM(names, c))
                if tobj is None or q[0] != tprev:   # expiries come in runs of one end
                    tprev = q[0]
                    tobj = _div(tprev, 1000000000)
                o = self.expired(tobj, names[q[1]], q[2], q[3])
                Py_INCREF(o)
                PyList_SET_ITEM(out, k, o)
                k += 1
                q += RUN_W
        return out

    cdef object lease(self, Eng* e, int64_t lid, object lid_obj, int64_t iid, object iid_obj):
        """Broker.lease(lid) for an active lease just granted (placement from the slots);
        ``lid_obj`` and ``iid_obj`` are lid and the intent id as Python ints."""
        cdef int64_t r = lid & ROW_MASK
        cdef int64_t d = e.lr[r].dim, n = e.lr[r].units, off = e.lr[r].slot_off, j, q, nd = 0
        cdef int64_t nodes[PLACE_MAX]
        cdef int64_t counts[PLACE_MAX]
        cdef cnp.ndarray owner_arr
        cdef const int64_t* owner
        cdef int64_t no, nslots
        cdef Py_ssize_t m
        cdef tuple slots, placement
        cdef list nn
        cdef object campaign, dim, units, state, firm, cls, granted, start, expiry, cost
        cdef object intent
        cdef _Maker mk = self.Lease
        if n > PLACE_MAX or off < 0:
            return self.lease_view(lid)
        owner_arr = <cnp.ndarray>self.node_of_slot[d]
        owner = <const int64_t*>cnp.PyArray_DATA(owner_arr)
        nslots = cnp.PyArray_DIM(owner_arr, 0)
        slots = PyTuple_New(n)
        for j in range(n):
            q = e.arena[off + j]
            if q < 0 or q >= nslots:
                raise IndexError(f"slot {q} out of range")
            s_obj = <object>q
            Py_INCREF(s_obj)
            PyTuple_SET_ITEM(slots, j, s_obj)
            no = owner[q]
            for m in range(nd):
                if nodes[m] == no:
                    counts[m] += 1
                    break
            else:
                nodes[nd] = no
                counts[nd] = 1
                nd += 1
        nn = self.node_names[d]
        placement = PyTuple_New(nd)
        for j in range(nd):
            p_obj = (nn[nodes[j]], <object>counts[j])
            Py_INCREF(p_obj)
            PyTuple_SET_ITEM(placement, j, p_obj)
        campaign = self.names[e.lr[r].camp]
        dim = self.dims[d]
        units = n
        state = _STATE_NAMES[e.lr[r].state]
        firm = e.lr[r].firm != 0
        cls = self.cls_names[e.lr[r].lcls]
        granted = _div(e.lr[r].t_grant, 1000000000)
        start = _div(e.lr[r].t_start, 1000000000)
        expiry = _div(e.lr[r].t_end, 1000000000)
        cost = _div(e.lr[r].cost, 1000000)
        intent = iid_obj if e.lr[r].intent == iid else <object>e.lr[r].intent
        o = mk.new()
        mk.put(o, 0, lid_obj)
        mk.put(o, 1, campaign)
        mk.put(o, 2, dim)
        mk.put(o, 3, units)
        mk.put(o, 4, state)
        mk.put(o, 5, firm)
        mk.put(o, 6, cls)
        mk.put(o, 7, granted)
        mk.put(o, 8, start)
        mk.put(o, 9, expiry)
        mk.put(o, 10, cost)
        mk.put(o, 11, None)
        mk.put(o, 12, intent)
        mk.put(o, 13, placement)
        mk.put(o, 14, slots)
        return mk.done(o)
