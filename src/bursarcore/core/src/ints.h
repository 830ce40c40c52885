/*
 * Integer arithmetic of the core (docs/spec.md §2): 128-bit intermediates, Python's floor
 * division and modulo (the reference's `//` and `%`), and int64 stores that wrap like
 * numpy's `+=`. Internal to the core; every function is inlined where it is called.
 */
#ifndef BURSARCORE_INTS_H
#define BURSARCORE_INTS_H

#include <stdint.h>

__extension__ typedef __int128 bc_i128;
__extension__ typedef unsigned __int128 bc_u128;

#define BC_HOUR_NS ((int64_t)3600000000000LL)
#define BC_MAXV ((int64_t)4611686018427387904LL) /* "unlimited", and the bound on magnitudes */
#define BC_PPM ((int64_t)1000000LL)
#define BC_I64_MAX ((int64_t)0x7FFFFFFFFFFFFFFFLL)
#define BC_I64_MIN ((int64_t)(-0x7FFFFFFFFFFFFFFFLL - 1))

static inline int64_t bc_max64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t bc_min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* a // b (b != 0), rounding toward minus infinity */
static inline int64_t bc_fdiv64(int64_t a, int64_t b)
{
    int64_t q;
    if (b == -1)
        return (int64_t)(0 - (uint64_t)a);
    q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0)))
        q -= 1;
    return q;
}

/* a % b (b > 0), in [0, b) */
static inline int64_t bc_fmod64(int64_t a, int64_t b)
{
    int64_t r = a % b;
    if (r < 0)
        r += b;
    return r;
}

/* a // b (b != 0), in 64 bits when both fit */
static inline bc_i128 bc_fdiv128(bc_i128 a, bc_i128 b)
{
    bc_i128 q;
    if (BC_I64_MIN < a && a <= BC_I64_MAX && BC_I64_MIN < b && b <= BC_I64_MAX)
        return bc_fdiv64((int64_t)a, (int64_t)b);
    if (b == -1)
        return -a;
    q = a / b;
    if (a - q * b != 0 && ((a < 0) != (b < 0)))
        q -= 1;
    return q;
}

/* a // BC_PPM (a constant divisor: a multiply, not a division, when a fits 64 bits) */
static inline bc_i128 bc_fdiv_ppm(bc_i128 a)
{
    int64_t v, q;
    if (BC_I64_MIN < a && a <= BC_I64_MAX) {
        v = (int64_t)a;
        q = v / BC_PPM;
        if (v < 0 && q * BC_PPM != v)
            q -= 1;
        return q;
    }
    return bc_fdiv128(a, BC_PPM);
}

/* a + b wrapped to int64 */
static inline int64_t bc_wadd(int64_t a, bc_i128 b)
{
    return (int64_t)((uint64_t)a + (uint64_t)(int64_t)b);
}

/* whether a * b overflows, the product to *r when it does not */
static inline int bc_mul_over128(bc_i128 a, bc_i128 b, bc_i128 *r)
{
    return __builtin_mul_overflow(a, b, r);
}

static inline int bc_mul_over64(int64_t a, int64_t b, int64_t *r)
{
    return __builtin_mul_overflow(a, b, r);
}

/* a value clamped to BC_MAXV */
static inline int64_t bc_cap_maxv(bc_i128 x)
{
    return x > BC_MAXV ? BC_MAXV : (int64_t)x;
}

#endif /* BURSARCORE_INTS_H */
