# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""``Broker.acquire``'s common case in one call (:class:`FastAcquire`), over the Cython binding
of the C core's engine. Private: a compiled broker makes one when its engine is
``bursarcore._engine``.

``FastAcquire`` does the common case (validate a plain ``Intent``, read the clock, expire,
admit, build the ``Decision`` and its ``Lease``, queue the ``expired`` events) in one C
call; it hands everything else back to the broker's general path (returns None before
changing anything) or calls the broker's steps it was given (its :class:`AcquirePort`:
``serve_pending``, ``slow``, ``retry_after``, ``reserve``, ``lease``) where the general
path would. It reaches the broker only through that port: the broker's tables and steps,
and the :class:`~bursarcore._brokerbase.Cursor` whose public fields (time, next intent id,
journal, clock, queued events...) both paths read and write. The decisions, events and
state are checked against the general path by ``tests/backends/test_acquire_paths_agree.py``.
It calls the engine's kernels (declared in ``_engine.pxd`` and compiled in here, so they
inline) on ``_engine``'s view of the state, and builds its result objects with
``_results``. For a run of intents through the batch loop (``Broker._acquire_many``) it
reads the intents (``inputs``) and builds the decisions on grants (``grants``) as here.
"""

import numpy as np
cimport numpy as cnp
from libc.stdint cimport int64_t, INT64_MIN
from cpython.list cimport PyList_Append, PyList_GET_SIZE
from cpython.ref cimport PyObject, Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.set cimport PySet_Discard, PySet_Add, PySet_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError, PyDict_Next
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.math cimport rint, isfinite, fabs

from ._engine cimport (Eng, Dec, _Ctx, _ctx, _pyint, _raise, imin, k_admit, k_advance,
                       k_binding_rule, k_cong_mult, k_decide, k_dim_figures, k_free, k_held,
                       k_levels_of, k_reusable,
                       k_ring_advance, k_row, E_HEAPFULL, MAXV, NCOL, O_GRANTED, O_REFUSED,
                       PREEMPT, RANK, ROW_MASK, R_CAPACITY, R_TOKENS, BC_LIMITS)
from ._results cimport (_Results, _ExpiredRun, _slot_offsets, _div, bc_slot, bc_set,
                        MAKER_MAX, RUN_W)
from .admission import state as _state
from .journal import records as J

cnp.import_array()

DEF ADV_CHUNK = 256
DEF J_ACQUIRE = 2
DEF J_EXPIRE = 7
DEF J_ADVANCE = 12

cdef double _MAX_S = <double>(1 << 62) / 1e9
cdef double _MAX_FIXED_S = <double>(1 << 62) / 1e6
cdef object _NONE = None
cdef tuple _REASON_NAMES = tuple(_state.REASONS)
cdef int64_t _R_DEADLINE = _state.REASONS.index("deadline")
cdef object _NAN = float("nan")
cdef dict _OUTCOME_CODE = {"granted": 1, "pending": 2, "refused": 3}
cdef dict _PATH_CODE = J.PATH_CODE


cdef inline bint _borrowed(Eng* e, int64_t lid):
    """Whether lease lid is borrowed (SPEC §14.8): not firm, of a class that is."""
    cdef int64_t r = lid & ROW_MASK
    return e.lr[r].firm == 0 and e.cls[e.lr[r].lcls * NCOL + PREEMPT] == 0

# the fields FastAcquire reads, in Intent's order (checked when it is built)
cdef tuple _INTENT_FIELDS = ("campaign", "units", "duration", "deadline", "max_spend",
                             "service_class", "ttl")
cdef enum:
    IN_CAMPAIGN, IN_UNITS, IN_DURATION, IN_DEADLINE, IN_MAX_SPEND, IN_CLASS, IN_TTL, IN_N
# the Cursor's fields, in its order (checked when FastAcquire is built): read and written
# at their slot offsets
cdef tuple _CURSOR_FIELDS = ("journal", "durable", "clock", "ttl", "t", "t_force",
                             "next_intent", "events", "default_cls", "deficit_last")
cdef enum:
    CU_JOURNAL, CU_DURABLE, CU_CLOCK, CU_TTL, CU_T, CU_T_FORCE, CU_NEXT, CU_EVENTS, CU_DCLS, \
        CU_DEFICIT, CU_N


cdef inline bint _count(object v, int64_t* out):
    """A plain int in [0, 2**62) (False: anything else, which the general path handles)."""
    cdef int ovf = 0
    cdef long long x
    if type(v) is not int:
        return False
    x = PyLong_AsLongLongAndOverflow(v, &ovf)
    if ovf or x < 0 or x >= (1LL << 62):
        return False
    out[0] = x
    return True


cdef inline bint _sec_ns(object x, int64_t* out):
    """units.to_ns for a plain float or a small int (False: anything else, or out of range,
    which the general path reports)."""
    cdef double v
    cdef int ovf = 0
    cdef long long i
    if type(x) is float:
        v = <double>x
    elif type(x) is int:
        i = PyLong_AsLongLongAndOverflow(x, &ovf)
        if ovf or not (-(1LL << 52) < i < (1LL << 52)):
            return False
        v = <double>i
    else:
        return False
    if not isfinite(v) or fabs(v) > _MAX_S:
        return False
    out[0] = <int64_t>rint(v * 1e9)
    return True


cdef tuple _acquire_record(tuple head, const int64_t *lim, int64_t T, int64_t left,
                           int64_t H, int64_t level, int64_t figure):
    """An acquire's journal record: ``head`` (its fields up to the unmet guarantees), the
    decision's limits (one per rule, capped at MAXV), then tokens, credits and holding
    after, and the level whose rule bound it with its figure, in one tuple."""
    cdef Py_ssize_t nh = len(head), j
    cdef object out = PyTuple_New(nh + BC_LIMITS + 5), x
    cdef int64_t tail[5]
    tail[0], tail[1], tail[2], tail[3], tail[4] = T, left, H, level, figure
    for j in range(nh):
        x = head[j]
        Py_INCREF(x)
        PyTuple_SET_ITEM(out, j, x)
    for j in range(BC_LIMITS):
        x = imin(lim[j], MAXV)
        Py_INCREF(x)
        PyTuple_SET_ITEM(out, nh + j, x)
    for j in range(5):
        x = tail[j]
        Py_INCREF(x)
        PyTuple_SET_ITEM(out, nh + BC_LIMITS + j, x)
    return <tuple>out


cdef inline int64_t _dl_field(bint has_dl, int64_t dl):
    """journal.records.deadline_field: -1 for none, INT64_MIN for a deadline of -1 ns."""
    if not has_dl:
        return -1
    return INT64_MIN if dl == -1 else dl


cdef struct _In:   # an intent's inputs (intent_inputs; ns, micro-credits, -1: no max_spend)
    Py_ssize_t c, d, k
    int64_t nmin, nmax, dur, spend, dl, ttl
    bint has_dl, has_spend


cdef class FastAcquire:
    """``Broker.acquire`` for the common case, in one call: an :class:`Intent` of plain
    values, no policy event due (the pending queue is served through the port's
    ``serve_pending`` when the broker would serve it and a key's wake-up is due; with none
    due that pass would only count itself, done here: ``_serve``), a warm grant, a refusal
    or a decision that needs the policy layer (the port's ``slow``). With a journal (one
    whose ``Journal.add`` is not overridden) it writes, through ``Journal.add_record``, the
    general path's records —
    ``expire`` per expiry, ``advance``, ``acquire`` — and ends the operation with
    ``journal.end_op(durable)`` as ``@_op`` does. Returns the :class:`Decision`, or None
    with nothing changed: the broker then takes its general path (which also raises every
    error). The specification is the broker's general path.

    Where the time of a call goes is Python's attribute machinery, so the hot reads skip
    it without caching anything the broker owns:

    * the intent's fields are read at their slot offsets (``Intent`` is slotted; the
      type is checked exactly, so the offsets are those of its member descriptors);
    * the broker's running fields (time, next intent id, journal, clock, queued events...)
      are its :class:`~bursarcore._brokerbase.Cursor`'s, read and written at that slotted
      class's slot offsets (checked when this is built). The cursor is the only place they
      live, for the broker's Python steps as for this;
    * a campaign's default class comes from the cursor's ``default_cls`` (set at
      registration from the envelope, which is immutable and registered once), not its
      envelope;
    * the view of the state (``_Ctx``) is fetched from the state's dict, and let go before
      any call that can grow the state, so ``EngineState._resize`` grows the lease store
      in place (``ndarray.resize`` refuses an array anything else references, and copies
      it instead) — and re-fetched after, as the arrays may have moved.
    """

    cdef object st, Intent
    cdef object q             # the broker's PendingQueue: its public intents and wake-ups
    cdef object cur           # the broker's Cursor, and its fields' slot offsets
    cdef Py_ssize_t coff[MAKER_MAX]
    cdef dict sd
    cdef Py_ssize_t ioff[MAKER_MAX]
    # the broker's steps for what leaves the common case (its AcquirePort)
    cdef object serve_pending, slow, retry_after, reserve, set_reserve
    cdef _Results res          # the Decision, Lease and Event objects it returns
    cdef dict cindex, dim_index, cls_index, pending
    cdef list names, pyev, opp, revoking, subscribers, draining
    cdef int64_t adv[ADV_CHUNK]
    # the cursor's default_cls as last seen (register replaces the array) and its data
    cdef object dcls
    cdef const int64_t* dcls_p
    cdef Py_ssize_t dcls_n
    # the journal the broker had at the last call, and how to add to it: 0 not at all
    # (Journal.add is overridden: the general path), 1 through its add_record
    cdef object jobj, Journal, replace, jadd
    cdef int jmode
    cdef bint jend
    # runs of expiries queued in the cursor's events since the last poll (_ExpiredRun)
    cdef Py_ssize_t nrun
    # whether the pending queue's wake-up check may be done here (_serve): the port says
    # so when the broker's serve_pending and wake-up test are its own (not a subclass's)
    cdef bint shortcut

    def __init__(self, port, Decision, Lease, Event, Intent, Cursor):
        self.q = port.queue
        self.st = port.state
        self.sd = port.state.__dict__
        self.cur = port.cursor
        if type(self.cur) is not Cursor:
            raise TypeError("FastAcquire: the port's cursor must be a Cursor")
        _slot_offsets(Cursor, _CURSOR_FIELDS, self.coff)
        self.res = _Results(port, Decision, Lease, Event)
        self.Intent = Intent
        _slot_offsets(Intent, _INTENT_FIELDS, self.ioff)
        self.cindex, self.dim_index, self.cls_index = \
            port.campaign_index, port.dim_index, port.class_index
        self.pending = self.q.intents
        self.names = port.names
        self.pyev, self.opp, self.revoking = port.python_events, port.opportunistic, port.revoking
        self.subscribers, self.draining = port.subscribers, port.draining
        self.serve_pending, self.slow = port.serve_pending, port.slow
        self.retry_after, self.reserve = port.retry_after, port.reserve
        self.set_reserve = port.set_reserve
        self.shortcut = bool(port.wake_shortcut)
        self.dcls = None
        import dataclasses
        from .journal import records as _jr
        from .journal.base import Journal
        if (_jr.OP["acquire"], _jr.OP["expire"], _jr.OP["advance"]) != \
                (J_ACQUIRE, J_EXPIRE, J_ADVANCE) or len(_jr.FIELDS) != 35 \
                or (_jr.deadline_field(None), _jr.deadline_field(-1)) != (-1, _dl_field(1, -1)):
            raise RuntimeError("FastAcquire: journal record codes moved")
        self.Journal, self.replace = Journal, dataclasses.replace
        self.jobj = None
        self.jmode = 0
        self.jend = False
        self.nrun = 0

    def __call__(self, intent):
        return self.acquire(intent)

    # -- the cursor's fields (see the class docstring) --------------------------------------
    cdef inline object _get(self, int i):
        """The cursor's field ``_CURSOR_FIELDS[i]``."""
        cdef PyObject* p = bc_slot(self.cur, self.coff[i])
        if p == NULL:
            raise AttributeError(f"Cursor.{_CURSOR_FIELDS[i]} is not set")
        return <object>p

    cdef inline void _set(self, int i, object v) noexcept:
        bc_set(self.cur, self.coff[i], v)

    cdef inline _Ctx _cx(self):
        """``_ctx(st)``: the cached view, checked against the state's dict entries."""
        cdef PyObject* p = PyDict_GetItemWithError(self.sd, "binding_view")
        cdef PyObject* q
        cdef _Ctx x
        if p != NULL and type(<object>p) is _Ctx:
            x = <_Ctx><object>p
            q = PyDict_GetItemWithError(self.sd, "version")
            if q != NULL and type(<object>q) is int and x.owner == <void*>self.st \
                    and x.version == <Py_ssize_t><object>q:
                return x
        return _ctx(self.st)

    cdef Py_ssize_t _default_class(self, Py_ssize_t c) except -2:
        """The class of campaign c's envelope (the cursor's ``default_cls[c]``), or -1."""
        cdef object a = self._get(CU_DCLS)
        cdef cnp.ndarray arr
        if a is not self.dcls:
            self.dcls = None
            if type(a) is not np.ndarray:
                return -1
            arr = <cnp.ndarray>a
            if cnp.PyArray_TYPE(arr) != cnp.NPY_INT64 or cnp.PyArray_NDIM(arr) != 1 \
                    or not cnp.PyArray_IS_C_CONTIGUOUS(arr):
                return -1
            self.dcls, self.dcls_p, self.dcls_n = a, <const int64_t*>cnp.PyArray_DATA(arr), \
                cnp.PyArray_DIM(arr, 0)
        if c < 0 or c >= self.dcls_n:
            return -1
        return self.dcls_p[c]

    # -- the journal --------------------------------------------------------------------------
    cdef int _journal_mode(self, object j) except -1:
        """How records reach ``j`` (see ``jmode``), cached per journal object."""
        cdef type tp
        if j is not self.jobj:
            tp = type(j)
            self.jobj = j
            self.jadd = j.add_record          # (its bound method, looked up once per journal)
            self.jmode = 0 if tp.add is not self.Journal.add else 1
            self.jend = tp.end_op is not self.Journal.end_op
        return self.jmode

    cdef int64_t _jadd(self, object j, tuple rec) except? -1:
        """``Journal.add_record`` of a record already in field order (its seq is rec[0],
        read from ``j.next_seq`` by the caller)."""
        if j is not self.jobj:
            self._journal_mode(j)
        return self.jadd(rec)

    cdef int _jend(self, object j) except -1:
        """The end of an operation (what ``@_op`` does)."""
        cdef bint durable = self._get(CU_DURABLE)
        if durable or self.jend:
            j.end_op(durable)
        return 0

    cdef int _admit(self, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k, int64_t nmin,
                    int64_t nmax, int64_t dur, int64_t spend, int64_t t, int64_t iid,
                    int64_t* buf) except -1:
        """``k_admit`` with room made first (the broker's ``_reserve``) and the expiry heap
        grown if it fills; raises on an engine error. The caller holds no ``_Ctx`` across
        the call (the store can grow in place) and re-fetches it after: growing moves the
        arrays."""
        cdef _Ctx cx = self._cx()
        cdef Eng* e = &cx.e
        cdef int r
        if c < 0 or c >= e.calloc or k < 0 or k >= e.K or d < 0 or d >= e.D:
            raise IndexError(f"campaign {c} / class {k} / dim {d} out of range")
        if (e.scal[2] + 1 > e.L and not k_reusable(e)) or e.arena_top[0] + nmax > e.A \
                or e.scal[3] + 2 > e.HC:
            cx = None
            self.reserve(1, nmax)
            cx = self._cx()
            e = &cx.e
        r = k_admit(e, c, d, k, nmin, nmax, dur, spend, t, iid, buf, NULL)
        if r == E_HEAPFULL:
            cx = None
            self.st.grow_heap()
            cx = self._cx()
            e = &cx.e
            r = k_admit(e, c, d, k, nmin, nmax, dur, spend, t, iid, buf, NULL)
        if r < 0:
            _raise(r, nmax)
        return r

    # -- acquire ----------------------------------------------------------------------------
    cdef int _serve(self, int64_t t) except -1:
        """The port's ``serve_pending(t)`` (queue not empty). When no key's wake-up is due
        (``_due``: ``Broker._wake_due``), that pass would only count itself, which is
        done here; otherwise the broker's pass."""
        if self.shortcut and self.q.by_key is True and not self._due(t):
            self.q.passes += 1
            return 0
        self.serve_pending(t)
        return 0

    cdef bint _due(self, int64_t t) except -1:
        """``Broker._wake_due(t)``: a key woken, a campaign's lease ended, a token wake time
        reached, or a dimension's free / reachable / firm-room units at a key's threshold
        or its congestion multiplier below one a key failed at (the heaps' tops)."""
        cdef object h, hf, hr, ho, hp
        cdef list lf, lr, lo, lp
        cdef _Ctx cx
        cdef Eng* e
        cdef Py_ssize_t d, D
        cdef int64_t fig[3]
        cdef object q = self.q
        if len(q.woken) or len(q.ended):
            return True
        h = q.wtime
        if h and h[0][0] <= t:
            return True
        lf, lr, lo, lp = q.wfree, q.wreach, q.wroom, q.wprice
        cx = self._cx()
        e = &cx.e
        D = e.D
        if len(lf) != D or len(lr) != D or len(lo) != D or len(lp) != D:
            return True
        for d in range(D):
            hf, hr, ho, hp = lf[d], lr[d], lo[d], lp[d]
            if hf or hr or ho:
                k_dim_figures(e, d, fig)
                if hf and hf[0][0] <= fig[0]:
                    return True
                if hr and hr[0][0] <= fig[1]:
                    return True
                if ho and ho[0][0] <= fig[2]:
                    return True
            if hp and hp[0][0] < -k_cong_mult(e, d):
                return True
        return False

    cdef bint _read(self, object intent, _In* a) except -1:
        """The inputs of an :class:`Intent` (its type checked by the caller) as
        ``Broker._acquire`` reads them (``intent_inputs``): False when anything is unusual,
        which the general path reads (and reports)."""
        cdef object v, key, x, cname, um, sc
        cdef PyObject* f[IN_N]
        cdef PyObject* p
        cdef PyObject* pk
        cdef PyObject* pv
        cdef Py_ssize_t i, pos = 0
        a.has_dl, a.has_spend, a.dl = False, False, 0
        for i in range(IN_N):
            f[i] = bc_slot(intent, self.ioff[i])
            if f[i] == NULL:
                return False
        cname = <object>f[IN_CAMPAIGN]
        um = <object>f[IN_UNITS]
        sc = <object>f[IN_CLASS]
        # (exact str keys: a lookup cannot run Python code or fail)
        if type(cname) is not str or not (sc is None or type(sc) is str):
            return False
        p = PyDict_GetItemWithError(self.cindex, cname)
        if p == NULL:
            return False
        a.c = <Py_ssize_t><object>p
        if type(um) is not dict or len(<dict>um) != 1:
            return False
        PyDict_Next(um, &pos, &pk, &pv)
        key, v = <object>pk, <object>pv
        if type(key) is not str:
            return False
        p = PyDict_GetItemWithError(self.dim_index, key)
        if p == NULL:
            return False
        a.d = <Py_ssize_t><object>p
        if sc is None:
            a.k = self._default_class(a.c)
            if a.k < 0:
                return False
        else:
            p = PyDict_GetItemWithError(self.cls_index, sc)
            if p == NULL:
                return False
            a.k = <Py_ssize_t><object>p
        if type(v) is int:
            if not _count(v, &a.nmin):
                return False
            a.nmax = a.nmin
        elif (type(v) is tuple or type(v) is list) and len(v) == 2:
            if not (_count(v[0], &a.nmin) and _count(v[1], &a.nmax)):
                return False
        else:
            return False
        if not _sec_ns(<object>f[IN_DURATION], &a.dur):
            return False
        x = <object>f[IN_MAX_SPEND]
        if x is None:
            a.spend = -1
        elif type(x) is float and isfinite(<double>x) and fabs(<double>x) < _MAX_FIXED_S:
            a.spend = <int64_t>rint(<double>x * 1e6)
            a.has_spend = True
        else:
            return False
        x = <object>f[IN_DEADLINE]
        if x is not None:
            if not _sec_ns(x, &a.dl):
                return False
            a.has_dl = True
        x = <object>f[IN_TTL]
        if not _sec_ns(self._get(CU_TTL) if x is None else x, &a.ttl):
            return False
        return True

    cpdef object inputs(self, object intent):
        """``intent_inputs(broker, intent)`` for a plain :class:`Intent` without a deadline or
        a max_spend, read as :meth:`acquire` reads it; None for any other intent (the
        broker reads it itself, and reports what is wrong with it)."""
        cdef _In a
        if type(intent) is not self.Intent or not self._read(intent, &a) or a.has_dl \
                or a.has_spend:
            return None
        return (a.c, a.d, a.k, a.nmin, a.nmax, a.dur, None, None, a.ttl)

    cpdef object acquire(self, object intent):
        cdef object x, jn, iid_obj, lid_obj, name, retry
        cdef _In a
        cdef Py_ssize_t c, d, k
        cdef int64_t nmin, nmax, dur, spend, dl = 0, ttl, t, told, iid, lid
        cdef bint has_dl = False, moved, due
        cdef Py_ssize_t freed
        cdef _Ctx cx
        cdef Eng* e
        cdef int r
        cdef double fv
        cdef int64_t buf[4]
        if type(intent) is not self.Intent:
            return None
        jn = self._get(CU_JOURNAL)
        if jn is not None and self._journal_mode(jn) == 0:
            return None
        if self._get(CU_T_FORCE) is not None:
            return None
        # -- the intent, as Broker._acquire reads it (anything unusual: the general path)
        if not self._read(intent, &a):
            return None
        c, d, k, nmin, nmax, dur, spend, ttl = a.c, a.d, a.k, a.nmin, a.nmax, a.dur, a.spend, a.ttl
        has_dl, dl = a.has_dl, a.dl
        # -- the clock, as Broker._now reads it
        x = self._get(CU_CLOCK).now()
        if type(x) is not float:
            return None
        fv = <double>x
        if not isfinite(fv) or fabs(fv) > _MAX_S:
            return None
        t = <int64_t>rint(fv * 1e9)
        told = self._get(CU_T)
        if t < told:
            return None
        # -- Broker._advance(t) when no python event is due and no subscriber would be
        # called back from inside the expiry loop
        if self.pyev and self.pyev[0][0] <= t:
            return None
        for x in self.draining:
            if x:
                return None
        moved = t > told
        cx = self._cx()
        e = &cx.e
        due = e.scal[3] > 0 and e.heap_t[0] <= t
        if due and self.subscribers:
            return None
        if jn is not None:
            cx = None
            return self._acquire_j(jn, c, d, k, nmin, nmax, dur, spend, has_dl, dl, ttl, t,
                                   moved, due, intent)
        k_ring_advance(e, t)
        freed = 0
        if due:
            freed = self._expire(e, t, None)
        cx = None                     # the calls below may grow the state
        if self.pending and (moved or freed):
            self._serve(t)
        if moved and t > <int64_t>self._get(CU_T):  # max(): a subscriber may have moved it
            self._set(CU_T, t)
        # -- Broker._acquire_ns / _decide_one
        iid_obj = self._get(CU_NEXT)
        iid = iid_obj
        if type(iid_obj) is not int:
            iid_obj = iid
        self._set(CU_NEXT, iid + 1)
        name = self.names[c]
        if has_dl and dl < t:
            return self.res.decision("refused", iid_obj, name, 0, None, None, "deadline",
                                     None, 0.0, -1)
        r = self._admit(c, d, k, nmin, nmax, dur, spend, t, iid, buf)
        if r == O_GRANTED:
            cx = self._cx()               # the state may have grown
            e = &cx.e
            lid = buf[2]
            lid_obj = lid
            if e.lr[lid & ROW_MASK].firm == 0:
                PySet_Add(self.opp[d], lid_obj)
            return self.res.decision("granted", iid_obj, name, buf[0],
                                     self.res.lease(e, lid, lid_obj, iid, iid_obj),
                                     "borrow" if _borrowed(e, lid) else "warm",
                                     None, None, _div(buf[3], 1000000), -1)
        if r == O_REFUSED:
            retry = None
            if buf[1] == R_TOKENS or buf[1] == R_CAPACITY:
                retry = self.retry_after(c, d, nmin, dur, buf[1])
            return self.res.decision("refused", iid_obj, name, 0, None, None,
                                     _REASON_NAMES[buf[1]], retry, 0.0, -1)
        return self.slow(iid, c, d, k, nmin, nmax, dur, spend, dl if has_dl else None, ttl, t,
                       intent)

    cdef object _acquire_j(self, object jn, Py_ssize_t c, Py_ssize_t d, Py_ssize_t k,
                           int64_t nmin, int64_t nmax, int64_t dur, int64_t spend, bint has_dl,
                           int64_t dl, int64_t ttl, int64_t t, bint moved, bint due,
                           object intent):
        """The rest of ``acquire`` with a journal (validated, nothing changed yet): the
        records ``Broker._advance`` and ``Broker._acquire_ns`` write, then what ``@_op``
        does at the end of an operation (``journal.end_op``)."""
        cdef object dec, name, deficit, lease_obj, retry, x
        cdef object iid_obj, lid_obj
        cdef bint note = moved and len(self.pending) > 0   # Broker._advance's, up front
        retry = None
        lease_obj = None
        cdef Py_ssize_t freed = 0, i
        cdef int64_t iid, seq, lid, tb, cb, fr, un, rank, units = 0, cost = 0, lease = -1
        cdef int64_t outcome = 0, reason = 0, path = 0
        cdef int r, err
        cdef _Ctx cx
        cdef Eng* e
        cdef Dec dc
        cdef int64_t buf[4]
        cdef int64_t lvs[BC_LIMITS]
        cdef int64_t figs[BC_LIMITS]
        cdef int64_t rule
        try:
            cx = self._cx()
            e = &cx.e
            k_ring_advance(e, t)
            if due:
                freed = self._expire(e, t, jn)
            cx = None
            if self.pending and (moved or freed):
                self._serve(t)
            if moved and t > <int64_t>self._get(CU_T):
                self._set(CU_T, t)
            if note:
                seq = jn.next_seq
                self._jadd(jn, (seq, t, J_ADVANCE, 4, 0, 0, 0, 0, -1, -1, -1, 0, 0, 0, -1, -1,
                                -1, 0, -1, -1, 0, _NAN, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                -1, 0))
            # -- Broker._acquire_ns: the request row (rule inputs before the decision)
            iid_obj = self._get(CU_NEXT)
            iid = iid_obj
            if type(iid_obj) is not int:
                iid_obj = iid
            self._set(CU_NEXT, iid + 1)
            cx = self._cx()
            e = &cx.e
            if c >= e.calloc or k >= e.K or d >= e.D:
                raise IndexError(f"campaign {c} / class {k} / dim {d} out of range")
            rank = e.cls[k * NCOL + RANK]
            deficit = self._get(CU_DEFICIT)[c]
            err = k_decide(e, c, d, k, nmin, nmax, dur, spend, t, True, &dc, NULL)
            if err:
                _raise(err)
            i = c * e.D + d
            tb, cb, fr, un = e.cd[i].T, e.cr[c].left, k_free(e, d), e.U[d]
            k_levels_of(e, c, d, k, dur, spend, lvs, figs)
            # -- Broker._decide_one
            name = self.names[c]
            if has_dl and dl < t:
                outcome, reason = 3, _R_DEADLINE
                dec = None
            else:
                cx = None
                r = self._admit(c, d, k, nmin, nmax, dur, spend, t, iid, buf)
                cx = self._cx()           # the state may have grown
                e = &cx.e
                if r == O_GRANTED:
                    lid = buf[2]
                    lid_obj = lid
                    if e.lr[lid & ROW_MASK].firm == 0:
                        PySet_Add(self.opp[d], lid_obj)
                    outcome, units, lease, cost = 1, buf[0], lid, e.lr[lid & ROW_MASK].cost
                    path = 3 if _borrowed(e, lid) else 1
                    lease_obj = self.res.lease(e, lid, lid_obj, iid, iid_obj)
                    cx = self._cx()
                    e = &cx.e
                    dec = None
                elif r == O_REFUSED:
                    outcome, reason = 3, buf[1]
                    retry = None
                    if buf[1] == R_TOKENS or buf[1] == R_CAPACITY:
                        cx = None
                        retry = self.retry_after(c, d, nmin, dur, buf[1])
                        cx = self._cx()
                        e = &cx.e
                    dec = None
                else:
                    cx = None
                    dec = self.slow(iid, c, d, k, nmin, nmax, dur, spend,
                                  dl if has_dl else None, ttl, t, intent)
                    outcome = _OUTCOME_CODE.get(dec.outcome, 4)
                    x = dec.reason
                    reason = _state.REASONS.index(x) if x else 0
                    x = dec.path
                    path = _PATH_CODE.get(x or "", 0)
                    units = dec.units
                    x = dec.lease
                    cx = self._cx()
                    e = &cx.e
                    if x is not None:
                        lease = x.id
                        if k_row(e, lease) < 0:
                            raise IndexError(f"lease {lease} out of range or stale")
                        cost = e.lr[lease & ROW_MASK].cost
            # -- Broker._record_decision, journal.add
            i = c * e.D + d
            seq = jn.next_seq
            rule = k_binding_rule(dc.lim, outcome == 1, units, nmax, reason)
            self._jadd(jn, _acquire_record(
                (seq, t, J_ACQUIRE, outcome, reason, path, rank, 0, d, k, c, nmin, nmax, dur,
                 spend, _dl_field(has_dl, dl), ttl, units, lease, iid, cost, deficit, tb, cb,
                 fr, un), dc.lim, e.cd[i].T, e.cr[c].left, k_held(e, c, d),
                 -1 if rule < 0 else lvs[rule], 0 if rule < 0 else figs[rule]))
            if dec is not None:
                return self.replace(dec, seq=seq)
            if outcome == 1:
                return self.res.decision("granted", iid_obj, name, units, lease_obj,
                                         "borrow" if path == 3 else "warm",
                                         None, None, _div(buf[3], 1000000), seq)
            if reason == _R_DEADLINE and has_dl and dl < t:
                return self.res.decision("refused", iid_obj, name, 0, None, None, "deadline",
                                         None, 0.0, seq)
            return self.res.decision("refused", iid_obj, name, 0, None, None,
                                     _REASON_NAMES[reason], retry, 0.0, seq)
        finally:
            self._jend(jn)

    cpdef Py_ssize_t expire(self, int64_t t) except? -2:
        """Broker._expire_until(t) when it has no subscriber and no retired slot draining
        (the broker checks): returns how many leases expired, or -1 (nothing done) when its
        journal takes records only through an overridden ``add``."""
        cdef object jn = self._get(CU_JOURNAL)
        if jn is not None and self._journal_mode(jn) == 0:
            return -1
        cdef _Ctx cx = self._cx()
        if cx.e.scal[3] > 0 and cx.e.heap_t[0] <= t:
            return self._expire(&cx.e, t, jn)
        return 0

    cdef Py_ssize_t _expire(self, Eng* e, int64_t t, object jn) except -1:
        """Broker._expire_until: expire, drop from the victim sets, and queue an
        ``expired`` event per lease (no subscriber: checked by the caller) — as fields in
        the run of expiries the cursor's ``events`` ends with (a new one if it ends with
        anything else), built by :meth:`events` when ``poll`` takes them. With a journal,
        one lease at a time, each with its ``expire`` record (state right after it).
        Returns how many expired. Calls no code that can grow the state."""
        cdef int err = 0
        cdef Py_ssize_t m, j, chunk = ADV_CHUNK if jn is None else 1
        cdef int64_t lid, d, c, i, seq, r
        cdef int64_t* q
        cdef list events
        cdef object opp, rv, last
        cdef _ExpiredRun run = None
        cdef Py_ssize_t total = 0
        # the campaigns with queue keys to wake when a lease of theirs (of their tree) ends
        # (the queue's wown), and the set of those that had one (its ended:
        # PendingQueue.lease_ended)
        cdef dict wown = self.q.wown
        cdef set ended = self.q.ended if len(wown) else None
        while True:
            m = k_advance(e, t, self.adv, chunk, &err)
            total += m
            if m:
                if run is None:
                    events = self._get(CU_EVENTS)
                    j = PyList_GET_SIZE(events)
                    last = events[j - 1] if j else None
                    if type(last) is _ExpiredRun and (<_ExpiredRun>last).owner is self:
                        run = <_ExpiredRun>last
                    else:
                        run = _ExpiredRun.__new__(_ExpiredRun)
                        run.owner = self
                        PyList_Append(events, run)
                        self.nrun += 1
                run.reserve(m)
            for j in range(m):
                lid = self.adv[j]
                r = lid & ROW_MASK
                d = e.lr[r].dim
                if e.lr[r].firm == 0:
                    opp = self.opp[d]
                    if PySet_GET_SIZE(opp):
                        PySet_Discard(opp, lid)
                rv = self.revoking[d]
                if PySet_GET_SIZE(rv) and PySet_Discard(rv, lid) == 1:
                    self.set_reserve(d)          # a victim gone before its deadline
                if ended is not None:
                    c = e.lr[r].camp
                    while e.cd[c * e.D].up > 0:         # a node of a tree: its top-level
                        c = e.cd[c * e.D].up - 1        # node's watch (PendingQueue._owner)
                    if c in wown:
                        PySet_Add(ended, c)
                q = run.rec + run.n * RUN_W
                q[0] = e.lr[r].t_end
                q[1] = e.lr[r].camp
                q[2] = lid
                q[3] = e.lr[r].units
                run.n += 1
                if jn is not None:
                    c = e.lr[r].camp
                    i = c * e.D + d
                    seq = jn.next_seq
                    self._jadd(jn, (seq, e.lr[r].t_end, J_EXPIRE, 0, 0, 0, 0, 0, d, e.lr[r].lcls,
                                    c, 0, 0, 0, -1, -1, -1, e.lr[r].units, lid, e.lr[r].intent,
                                    e.lr[r].cost, _NAN, 0, 0, 0, 0, 0, 0, 0, 0, e.cd[i].T,
                                    e.cr[c].left, k_held(e, c, d), -1, 0))
            if err:
                _raise(err, "a lease id in the expiry heap")
            if m < chunk:
                return total

    cpdef list events(self, list ev, bint take):
        """``ev`` (the cursor's ``events``) with each run of expiries it holds replaced, where
        it stands, by their :class:`Event` objects: a new list (``ev`` itself if it holds
        none). ``take``: ``poll`` is taking them (the broker's list starts anew)."""
        if self.nrun == 0:
            return ev
        if take:
            self.nrun = 0
        return self.res.events(ev)

    cpdef Py_ssize_t grants(self, list decs, int64_t iid0, Py_ssize_t j0, Py_ssize_t j,
                            const int64_t[::1] ci, const int64_t[::1] out_n,
                            const int64_t[::1] out_l, int64_t seq0) except -1:
        """The decisions on items j0..j of a run of the batch loop (``Broker._acquire_run``)
        when every one of them is a warm grant: appended to ``decs``, each the
        :class:`Decision` and :class:`Lease` that ``acquire`` returns for that grant (item i
        is intent ``iid0 + i``; its journal seq ``seq0 + i - j0``, or -1 without a
        journal). Returns j; or j0, with nothing appended, when an item of the segment is
        not a grant (the broker builds those decisions itself)."""
        cdef Py_ssize_t i
        cdef int64_t lid, iid, c
        cdef object iid_obj
        cdef list names = self.names
        if j0 < 0 or j > out_l.shape[0] or j > out_n.shape[0] or j > ci.shape[0]:
            raise IndexError(f"items {j0}..{j} out of range")
        for i in range(j0, j):
            if out_l[i] < 0:
                return j0
        cdef _Ctx cx = self._cx()
        cdef Eng* e = &cx.e
        for i in range(j0, j):
            lid, c, iid = out_l[i], ci[i], iid0 + i
            if k_row(e, lid) < 0 or c < 0 or c >= PyList_GET_SIZE(names):
                raise IndexError(f"lease {lid} / campaign {c} out of range")
            iid_obj = iid
            PyList_Append(decs, self.res.decision(
                "granted", iid_obj, names[c], out_n[i], self.res.lease(e, lid, lid, iid, iid_obj),
                "warm", None, None, _div(e.lr[lid & ROW_MASK].cost, 1000000),
                seq0 + (i - j0) if seq0 >= 0 else -1))
        return j
