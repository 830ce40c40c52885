# Declarations of bursarcore._results, cimported by bursarcore._acquire: the makers of the
# broker's result objects (see _results.pyx), the runs of queued expired events, and the C
# helpers that read and set the slots of slotted dataclass instances (bc_slot, bc_fill, bc_set).

from libc.stdint cimport int64_t
from cpython.ref cimport PyObject

from ._engine cimport Eng

cdef enum:
    MAKER_MAX = 16     # the most fields a _Maker fills
    RUN_W = 4          # an expiry queued in a run: end (ns), campaign, lease id, units

cdef extern from *:
    """
    static CYTHON_INLINE PyObject* bc_alloc(PyObject* cls) {
        PyTypeObject* tp = (PyTypeObject*)cls;
        return tp->tp_alloc(tp, 0);
    }
    /* a new instance of a tuple subclass of n items, all NULL (as tuple.__new__ makes
       one before it fills it) */
    static CYTHON_INLINE PyObject* bc_alloc_n(PyObject* cls, Py_ssize_t n) {
        PyTypeObject* tp = (PyTypeObject*)cls;
        return tp->tp_alloc(tp, n);
    }
    /* set item i of a tuple (subclass instance) made by bc_alloc_n */
    static CYTHON_INLINE void bc_item(PyObject* o, Py_ssize_t i, PyObject* v) {
        Py_INCREF(v);
        PyTuple_SET_ITEM(o, i, v);
    }
    /* a slot's value, borrowed (NULL: unset) */
    static CYTHON_INLINE PyObject* bc_slot(PyObject* o, Py_ssize_t off) {
        return *(PyObject**)((char*)o + off);
    }
    /* set a slot of a new object (all its slots are NULL: nothing to release) */
    static CYTHON_INLINE void bc_fill(PyObject* o, Py_ssize_t off, PyObject* v) {
        Py_INCREF(v);
        *(PyObject**)((char*)o + off) = v;
    }
    /* replace a slot's value (of a live object: the old value is released) */
    static CYTHON_INLINE void bc_set(PyObject* o, Py_ssize_t off, PyObject* v) {
        PyObject** slot = (PyObject**)((char*)o + off);
        PyObject* old = *slot;
        Py_INCREF(v);
        *slot = v;
        Py_XDECREF(old);
    }
    """
    object bc_alloc(object cls)
    object bc_alloc_n(object cls, Py_ssize_t n)
    void bc_item(object o, Py_ssize_t i, object v) noexcept
    PyObject* bc_slot(object o, Py_ssize_t off) noexcept
    void bc_fill(object o, Py_ssize_t off, object v) noexcept
    void bc_set(object o, Py_ssize_t off, object v) noexcept
    void PyObject_GC_UnTrack(object o)


cdef inline object _div(int64_t v, int64_t by):
    """v / by as Python's int true division (correctly rounded): exact in doubles below 2**53."""
    if -(1LL << 53) <= v <= (1LL << 53):
        return (<double>v) / (<double>by)
    return (<object>v) / (<object>by)


cdef int _slot_offsets(object cls, tuple names, Py_ssize_t* out) except -1


cdef class _Maker:
    cdef object cls
    cdef Py_ssize_t off[MAKER_MAX]

    cdef inline object new(self):
        return bc_alloc(self.cls)

    cdef inline void put(self, object o, Py_ssize_t i, object v) noexcept:
        bc_fill(o, self.off[i], v)

    cdef inline object done(self, object o):
        # frozen, and holding only atoms and tuples of atoms (a Decision: its Lease): it
        # can never be part of a reference cycle, so the cycle collector need not scan it
        PyObject_GC_UnTrack(o)
        return o


cdef class _ExpiredRun:
    cdef object owner          # the FastAcquire that queued it
    cdef int64_t* rec          # RUN_W int64 per event
    cdef Py_ssize_t n, cap
    cdef int reserve(self, Py_ssize_t m) except -1


cdef class _Results:
    cdef object lease_view          # the broker's lease(lid), for what it does not build
    cdef _Maker Decision, Lease
    cdef object Event               # a named tuple's class
    cdef list names, dims, cls_names, node_of_slot, node_names
    cdef object decision(self, object outcome, object iid, object name, object units,
                         object lease, object path, object reason, object retry,
                         object cost, object seq)
    cdef object expired(self, object time, object name, object lid, object units)
    cdef list events(self, list ev)
    cdef object lease(self, Eng* e, int64_t lid, object lid_obj, int64_t iid, object iid_obj)
