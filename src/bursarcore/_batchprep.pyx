# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled batch helpers. Private: import :mod:`bursarcore.batchprep` instead.

Same contract as the pure-Python reference in :mod:`bursarcore.batchprep` (the
specification): :func:`minmax` is an int64 column's least and greatest item in one pass,
:func:`finish` turns ``Broker.admit_batch``'s lease column into its outcome and intent
columns (and zeroes the units of items without a lease) in one pass.
"""

import numpy as np
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t

cnp.import_array()


cdef inline cnp.ndarray _column(object a, bint write):
    if (type(a) is not np.ndarray or cnp.PyArray_TYPE(<cnp.ndarray>a) != cnp.NPY_INT64
            or cnp.PyArray_NDIM(<cnp.ndarray>a) != 1
            or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a)
            or (write and not cnp.PyArray_ISWRITEABLE(<cnp.ndarray>a))):
        raise TypeError("expected a contiguous one-dimensional int64 numpy array"
                        + (" (writeable)" if write else ""))
    return <cnp.ndarray>a


def minmax(a):
    """(least, greatest) item of a non-empty contiguous 1-D int64 array."""
    cdef cnp.ndarray arr = _column(a, False)
    cdef Py_ssize_t i, n = cnp.PyArray_DIM(arr, 0)
    if n == 0:
        raise ValueError("minmax of an empty array")
    cdef const int64_t* p = <const int64_t*>cnp.PyArray_DATA(arr)
    # four independent lanes (the compare-and-select chains overlap), then the tail
    cdef int64_t l0 = p[0], l1 = p[0], l2 = p[0], l3 = p[0]
    cdef int64_t h0 = p[0], h1 = p[0], h2 = p[0], h3 = p[0], x
    with nogil:
        i = 0
        while i + 4 <= n:
            x = p[i]
            l0 = x if x < l0 else l0
            h0 = x if x > h0 else h0
            x = p[i + 1]
            l1 = x if x < l1 else l1
            h1 = x if x > h1 else h1
            x = p[i + 2]
            l2 = x if x < l2 else l2
            h2 = x if x > h2 else h2
            x = p[i + 3]
            l3 = x if x < l3 else l3
            h3 = x if x > h3 else h3
            i += 4
        while i < n:
            x = p[i]
            l0 = x if x < l0 else l0
            h0 = x if x > h0 else h0
            i += 1
    l0 = l1 if l1 < l0 else l0
    l2 = l3 if l3 < l2 else l2
    h0 = h1 if h1 > h0 else h0
    h2 = h3 if h3 > h2 else h2
    return (l2 if l2 < l0 else l0), (h2 if h2 > h0 else h0)


def finish(out_n, out_l, int64_t iid0):
    """(outcome, intent): outcome 1 where ``out_l < 0`` (no lease: refused) and 0
    elsewhere, intent ids ``iid0 + j``; ``out_n`` is set to 0 where ``out_l < 0``."""
    cdef cnp.ndarray un = _column(out_n, True), ul = _column(out_l, False)
    cdef Py_ssize_t j, n = cnp.PyArray_DIM(ul, 0)
    if cnp.PyArray_DIM(un, 0) != n:
        raise ValueError("finish: out_n and out_l differ in length")
    cdef cnp.ndarray oo = cnp.PyArray_EMPTY(1, cnp.PyArray_DIMS(ul), cnp.NPY_INT64, 0)
    cdef cnp.ndarray ii = cnp.PyArray_EMPTY(1, cnp.PyArray_DIMS(ul), cnp.NPY_INT64, 0)
    cdef int64_t* pn = <int64_t*>cnp.PyArray_DATA(un)
    cdef const int64_t* pl = <const int64_t*>cnp.PyArray_DATA(ul)
    cdef int64_t* po = <int64_t*>cnp.PyArray_DATA(oo)
    cdef int64_t* pi = <int64_t*>cnp.PyArray_DATA(ii)
    cdef uint64_t none
    with nogil:
        for j in range(n):           # branch-free, so the compiler can vectorise it
            none = (<uint64_t>pl[j]) >> 63
            po[j] = <int64_t>none
            pn[j] &= <int64_t>(none - 1)
            pi[j] = iid0 + j
    return oo, ii
