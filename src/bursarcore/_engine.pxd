# distutils: extra_compile_args = -fwrapv -ffp-contract=off --param=max-inline-insns-single=2000 --param=inline-unit-growth=400
# (the flags above: every module that cimports this file compiles engine.h's inline rules,
# and builds with them: wrapping integer arithmetic and no fused multiply-adds, as the core)
#
# Declarations of the Cython binding of the C core's admission engine, cimported by the
# modules built on it:
# * the C core's engine API (core/src/engine.h, with rules.h's arithmetic): constants,
#   codes, the record structs and the inline kernels, compiled into each module that
#   calls them;
# * bursarcore._engine's view of an EngineState (_Ctx, fetched with _ctx) and its helpers
#   for turning results into Python ints (_pyint) and error codes into exceptions (_raise).

from libc.stdint cimport int32_t, int64_t

cdef extern from *:
    ctypedef long long i128 "bc_i128"
    ctypedef unsigned long long u128 "bc_u128"

# The admission engine: the C core's (core/src/engine.h), every rule once; bursarcore._engine
# binds it to EngineState's arrays and to Python, bursarcore._acquire and _results use it.
cdef extern from "engine.h" nogil:
    const int64_t HOUR "BC_HOUR_NS"
    const int64_t MAXV "BC_MAXV"
    const int64_t PPM "BC_PPM"
    const int64_t I64_MAX "BC_I64_MAX"
    const int64_t I64_MIN "BC_I64_MIN"
    const int64_t ROW_MASK "BC_ROW_MASK"      # lease id = row | generation << ROW_BITS
    const int64_t GEN_MASK "BC_GEN_MASK"
    const int64_t ROW_BITS "BC_ROW_BITS"
    const double C_FS_REBASE "BC_FS_REBASE"
    const int64_t REC_WIDTH "BC_REC_WIDTH"

    # class-table columns
    enum:
        RANK "BC_K_RANK"
        MULT "BC_K_MULT"
        PRICED "BC_K_PRICED"
        PREEMPT "BC_K_PREEMPT"
        GRACE "BC_K_GRACE"
        FREEBROKE "BC_K_FREEBROKE"
        NCOL "BC_K_NCOL"
    # reason codes, outcomes, lease states, paths (checked against admission.state below)
    enum:
        R_OK "BC_REASON_NONE"
        R_CAPACITY "BC_REASON_CAPACITY"
        R_TOKENS "BC_REASON_TOKENS"
        R_CREDITS "BC_REASON_CREDITS"
        R_CEILING "BC_REASON_CEILING"
        NREASONS "BC_REASONS"
    enum:
        BC_LIMITS
        LIMIT_CAPACITY "BC_LIMIT_CAPACITY"
    enum:
        O_GRANTED "BC_GRANTED"
        O_REFUSED "BC_REFUSED"
        O_SLOW "BC_DEFERRED"
    enum:
        L_STARTING "BC_LEASE_STARTING"
        L_ACTIVE "BC_LEASE_ACTIVE"
        L_REVOKING "BC_LEASE_REVOKING"
        L_RELEASED "BC_LEASE_RELEASED"
        L_EXPIRED "BC_LEASE_EXPIRED"
        L_REVOKED "BC_LEASE_REVOKED"
    enum:
        P_WARM "BC_P_WARM"
        P_RECLAIM "BC_P_RECLAIM"
        P_COLD "BC_P_COLD"
    # error codes of the kernels (all < 0)
    enum:
        E_LEASES "BC_E_LEASES"
        E_ARENA "BC_E_ARENA"
        E_SLOTS "BC_E_SLOTS"
        E_STACK "BC_E_STACK"
        E_HEAPFULL "BC_E_HEAPFULL"
        E_ZERODIV "BC_E_ZERODIV"
        E_INDEX "BC_E_INDEX"
        E_RANGE "BC_E_RANGE"
        E_EMPTY "BC_E_EMPTY"
        E_ENDED "BC_E_ENDED"

    ctypedef struct CdRow "bc_cdrow":
        int64_t tlast, H, T, s, b, Bcap, acc, tok_debited
        int64_t g, Hf, tok_minted, tok_refunded, tok_clipped, up, Rch, Xch
    ctypedef struct CRow "bc_crow":
        int64_t left, escrow, cred_debited, budget, spent, refunded
        double fsS, fsG
    ctypedef struct LRow "bc_lrow":
        int64_t camp, dim, units, firm, state, lcls, t_end, slot_off
        int64_t t_grant, t_start, dur, excess, cost, revoke_at, intent, gen
    ctypedef struct Eng "bc_eng":
        long long D, K, NT, bins, W, calloc, L, A, HC
        long long bin_ns
        int64_t* cap
        int64_t* headroom
        int64_t* occ
        int64_t* prom
        int64_t* rev
        int64_t* resv
        int64_t* F
        int64_t* U
        int64_t* oppa
        int64_t* pend
        int64_t* price
        int64_t* gsum
        int64_t* cls
        int64_t* cong_thr
        int64_t* cong_mult
        int64_t* ring
        int64_t* ring_sum
        int64_t* scal
        int32_t* free_slots
        int64_t* top
        CdRow* cd
        CRow* cr
        int64_t* gch
        int64_t* Hsub
        int64_t* bor
        int64_t* sib
        int64_t* fs_par
        long long fs_t
        double fs_w
        int fs_ok
        LRow* lr
        int64_t* lex
        int64_t* freeq
        int64_t* lfree
        int32_t* arena
        int64_t* arena_top
        int64_t* heap_t
        int64_t* heap_id
    ctypedef struct Dec "bc_dec":
        int64_t n, reason, path, pm
        int64_t lim[BC_LIMITS]       # the rules' limits, in BC_LIMIT_* order
        int64_t warm
    ctypedef struct Memo "bc_memo":
        pass

    # the arithmetic of SPEC §2 and the rules of §4 on one campaign's numbers (rules.h)
    int64_t imax "bc_max64"(int64_t a, int64_t b)
    int64_t imin "bc_min64"(int64_t a, int64_t b)
    int64_t fdiv64 "bc_fdiv64"(int64_t a, int64_t b)
    int64_t fmod64 "bc_fmod64"(int64_t a, int64_t b)
    i128 fdiv128 "bc_fdiv128"(i128 a, i128 b)
    i128 fdiv_ppm "bc_fdiv_ppm"(i128 a)
    int64_t wadd "bc_wadd"(int64_t a, i128 b)
    int64_t _cap "bc_cap_maxv"(i128 x)
    int64_t bc_excess(int64_t H, int64_t n, int64_t s)
    int64_t bc_sustained_room(int64_t H, int64_t s)
    int64_t bc_ceiling_room(int64_t b, int64_t H)
    int64_t bc_unmet(int64_t g, int64_t Hf)
    int64_t bc_firm_limit(int64_t cap, int64_t F, int64_t U, int64_t unmet_own)
    int64_t bc_warm_firm(int64_t free, int64_t firm_limit)
    int64_t bc_warm_opportunistic(int64_t free, int64_t headroom)
    int64_t bc_reachable(int64_t free, int64_t oppa, int64_t rev, int64_t prom)
    i128 k_cost "bc_cost"(int64_t n, int64_t dur, int64_t pm)
    bint mul_over "bc_mul_over128"(i128 a, i128 b, i128* r)
    bint mul_over64 "bc_mul_over64"(int64_t a, int64_t b, int64_t* r)

    # the engine's kernels (engine.h)
    void k_memo_init(Memo* mo)
    void k_settle(Eng* e, int64_t c, int64_t d, int64_t t)
    int64_t k_unmet(const Eng* e, int64_t c, int64_t d)
    int64_t k_path_slack(const Eng* e, int64_t c, int64_t d)
    int64_t k_held(const Eng* e, int64_t c, int64_t d)
    # §14.2 the level whose rule bound a decision, as a journal record names it (tree.h)
    void k_levels_of(const Eng* e, int64_t c, int64_t d, int64_t k, int64_t dur,
                     int64_t max_spend, int64_t* lv, int64_t* fig)
    int64_t k_binding_rule(const int64_t* lim, int granted, int64_t n, int64_t nmax,
                           int64_t reason)
    int64_t k_child_room(const Eng* e, int64_t p, int64_t d)
    int64_t k_child_load_room(const Eng* e, int64_t p, int64_t d)
    void k_link(Eng* e, int64_t c, int64_t p, int64_t t)
    void k_make_root(Eng* e, int64_t c)
    void k_enlist(Eng* e, int64_t c, int64_t p)
    void k_change_node(Eng* e, int64_t c, const int64_t* g, const int64_t* s,
                       const int64_t* b, const int64_t* Bcap, int64_t budget, int64_t t)
    int64_t k_free(const Eng* e, int64_t d)
    double k_fs_weight(Eng* e, int64_t t)
    void k_hold(Eng* e, int64_t c, int64_t d, int64_t delta, int firm)
    void k_ring_advance(Eng* e, int64_t t)
    i128 k_cong_ppm(const Eng* e, int64_t d)
    int64_t k_cong_mult(const Eng* e, int64_t d)
    int64_t k_cong_mult_f(const Eng* e, int64_t d, int64_t free)
    i128 k_price(const Eng* e, int64_t d, int64_t k)
    i128 k_price_f(const Eng* e, int64_t d, int64_t k, int64_t free)
    void k_shortfall(Eng* e, int64_t d, int64_t units)
    i128 k_charge(const Eng* e, int64_t c, const int64_t* kc, i128 price)
    int k_decide(Eng* e, int64_t c, int64_t d, int64_t k, int64_t nmin, int64_t nmax,
                 int64_t dur, int64_t max_spend, int64_t t, int exact, Dec* o, Memo* mo)
    int64_t k_never(const Eng* e, int64_t c, int64_t d, int64_t k, int64_t nmin,
                    int64_t dur, int64_t pm)
    void k_heap_push(Eng* e, int64_t t, int64_t lid)
    void k_heap_pop(Eng* e)
    int64_t k_next_expiry(Eng* e)
    bint k_reusable(const Eng* e)
    int64_t k_row_ahead(const Eng* e, int64_t a)
    int64_t k_row(const Eng* e, int64_t lid)
    int k_room(const Eng* e, int64_t d, int64_t n, int64_t leases, int place)
    int64_t k_grant(Eng* e, int64_t c, int64_t d, int64_t k, int64_t n, int64_t dur,
                    int64_t pm, int64_t t, int starting, int64_t intent)
    int64_t k_commit(Eng* e, int64_t c, int64_t d, int64_t k, int64_t n, int64_t dur,
                     int64_t pm, int64_t t, int starting, int64_t intent, Memo* mo)
    int k_activate(Eng* e, int64_t lid, int64_t t)
    int k_end_lease(Eng* e, int64_t lid, int64_t t, int64_t new_state)
    int k_renew(Eng* e, int64_t lid, int64_t ext, int64_t t, int64_t max_spend,
                i128* price_out)
    int64_t k_advance(Eng* e, int64_t t, int64_t* out, int64_t outlen, int* err)
    int k_admit(Eng* e, int64_t c, int64_t d, int64_t k, int64_t nmin, int64_t nmax,
                int64_t dur, int64_t max_spend, int64_t t, int64_t intent, int64_t* out,
                Memo* mo)
    int64_t k_batch(Eng* e, const int64_t* camps, const int64_t* ks, const int64_t* dims,
                    const int64_t* nmins, const int64_t* nmaxs, const int64_t* durs,
                    int64_t t, int64_t intent0, int64_t* on, int64_t* orz, int64_t* ol,
                    int64_t j, int64_t m, int* err, int64_t* rec)
    void k_dim_figures(const Eng* e, int64_t d, int64_t* out)
    i128 k_token_wait(Eng* e, int64_t c, int64_t d, int64_t n, int64_t dur)
    int k_quote_cell(Eng* e, int64_t c, int64_t d, int64_t k, int64_t n, int64_t dur,
                     int64_t t, i128* charge, int64_t* path, int64_t* reason)
    int64_t k_decide_keys(Eng* e, const int64_t* keys, int64_t K, int64_t t,
                          int64_t* out_reason, int* err)
    int k_preempt(Eng* e, int64_t lid, int64_t t, int64_t grace)
    int64_t k_batch_plain(Eng* e, const int64_t* camps, const int64_t* ks,
                          const int64_t* dims, const int64_t* nmins, const int64_t* nmaxs,
                          const int64_t* durs, int64_t t, int64_t intent0, int64_t* on,
                          int64_t* orz, int64_t* ol, int64_t j, int64_t m, int* err)
    int64_t k_batch_rec(Eng* e, const int64_t* camps, const int64_t* ks,
                        const int64_t* dims, const int64_t* nmins, const int64_t* nmaxs,
                        const int64_t* durs, int64_t t, int64_t intent0, int64_t* on,
                        int64_t* orz, int64_t* ol, int64_t j, int64_t m, int* err,
                        int64_t* rec)


cdef class _Ctx:
    cdef Eng e
    cdef list refs            # the arrays the pointers point into, kept alive
    cdef Py_ssize_t version
    cdef void* owner          # the state it was built from (borrowed: lives in its __dict__)
    cdef object out4_obj      # the last `out` array of admit and its data pointer
    cdef int64_t* out4_ptr
    cdef object adv_obj       # the last `out` array of advance, its data and length
    cdef int64_t* adv_ptr
    cdef Py_ssize_t adv_len


cdef _Ctx _ctx(object st)
cdef object _pyint(i128 v)
cdef int _raise(int err, object what=*) except -1
