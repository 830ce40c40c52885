/*
 * The tree of envelopes in the admission engine (docs/spec.md §14): a node's place (its
 * parent, its children's guarantees, commitments and loads), the walks up a node's path that
 * keep commitments R, slack and loads K (§14.2, §14.3), and what every level of the path
 * allows, takes and gives back on a decision, a grant, an end and a renewal. A flat campaign
 * (up == 0) never walks: the engine's paths fold its tree figures away. Part of engine.h
 * (include that).
 */
#ifndef BURSARCORE_TREE_H
#define BURSARCORE_TREE_H
/* -- the tree of envelopes (§14) ---------------------------------------------------------- */

static inline int64_t k_parent_of(const bc_eng *e, int64_t v);

/* A node's `up`: its parent's index + 1 for a child, BC_UP_ROOT for a top-level node with
 * children, 0 for a flat campaign (a top-level node without children). The rules of §14 on a
 * flat campaign are those of §3–§4: its tree figures are zeros, and the engine decides it
 * with them folded away, at the cost of one predictable branch (up == 0) where it reads or
 * changes them; the walks up a node's ancestors are out of line. */
enum { BC_UP_ROOT = -1, BC_FLAT_ONLY = -1 };

#if defined(__GNUC__)
#define BC_WALK static __attribute__((noinline, cold, unused))
#else
#define BC_WALK static
#endif

/* §14.2, §14.3 one walk up node c's path on d for a lease of c for dur ns at t (with
 * `settle`, each ancestor's bucket settled to t first; without, the walk writes nothing):
 * what the ancestors allow it, to xlim[BC_LIMIT_CEILING] the least over them of
 * E_v + b_v − K_v and to xlim[BC_LIMIT_TOKENS] the least of E_v + the token limit at K_v (a
 * grant of n raises K_v by max(0, n − E_v), E_v the guarantees the path below v leaves
 * unused), BC_MAXV for the other rules; to *left the least credits left over the path, c's
 * own included (§4.3: the budget that binds a cost escrowed in every one). Returns Σ of the
 * ancestors' slack (c's firm room beyond its own slack, §14.3). With lv (not NULL), to
 * lv[q] the node of the path whose figure each least is, c's own limits for the ceiling and
 * the tokens and its budget first, an ancestor only when strictly less (the nearest of
 * equals); -1 for capacity. */
static inline int64_t k_path_at(bc_eng *e, int64_t c, int64_t d, int64_t dur, int64_t t,
                                int settle, int64_t *xlim, int64_t *left, int64_t *lv)
{
    int64_t D = e->D, i = c * D + d, v, E, H, s, lim, slack = 0;
    int instant = e->scal[1] != 0, tokens = instant || dur != 0, q;
    for (q = 0; q < BC_LIMITS; q++)
        xlim[q] = BC_MAXV;
    *left = e->cr[c].left;
    if (lv != NULL) {               /* c's own limits, which an ancestor's must be below */
        for (q = 0; q < BC_LIMITS; q++)
            lv[q] = q == BC_LIMIT_CAPACITY ? -1 : c;
        xlim[BC_LIMIT_CEILING] = bc_ceiling_room(e->cd[i].b, e->cd[i].H);
        if (tokens)                 /* (dur 0: the node's own rule refuses it) */
            xlim[BC_LIMIT_TOKENS] = instant
                ? bc_token_limit_instant(e->cd[i].H, e->cd[i].s, e->cd[i].T)
                : bc_token_limit(e->cd[i].H, e->cd[i].s, e->cd[i].T, dur);
    }
    E = bc_unmet(e->cd[i].g, e->cd[i].H);
    for (v = k_parent_of(e, c); v >= 0; v = k_parent_of(e, v)) {
        if (settle)
            k_settle(e, v, d, t);
        i = v * D + d;
        H = e->cd[i].H;
        s = e->cd[i].s;
        slack += bc_slack(e->cd[i].g, e->cd[i].Hf, e->cd[i].Rch);
        if (e->cr[v].left < *left) {
            *left = e->cr[v].left;
            if (lv != NULL)
                lv[BC_LIMIT_CREDITS] = v;
        }
        lim = bc_cap_maxv((bc_i128)E + bc_ceiling_room(e->cd[i].b, H));
        if (lim < xlim[BC_LIMIT_CEILING]) {
            xlim[BC_LIMIT_CEILING] = lim;
            if (lv != NULL)
                lv[BC_LIMIT_CEILING] = v;
        }
        if (tokens) {
            lim = instant ? bc_token_limit_instant(H, s, e->cd[i].T)
                          : bc_token_limit(H, s, e->cd[i].T, dur);
            lim = bc_cap_maxv((bc_i128)E + lim);
            if (lim < xlim[BC_LIMIT_TOKENS]) {
                xlim[BC_LIMIT_TOKENS] = lim;
                if (lv != NULL)
                    lv[BC_LIMIT_TOKENS] = v;
            }
        }
        E += bc_unmet(e->cd[i].g, H);
    }
    return slack;
}

/* k_path_at for a decision: the ancestors' buckets settled to t, no levels. */
BC_WALK int64_t k_path_read(bc_eng *e, int64_t c, int64_t d, int64_t dur, int64_t t,
                            int64_t *xlim, int64_t *left)
{
    return k_path_at(e, c, d, dur, t, 1, xlim, left, NULL);
}

/* §14.3 Σ slack_v over node c and its ancestors on d: what a firm grant to c may take beyond
 * cap − Σ_top R (c's unmet guarantee, for a flat campaign). */
BC_WALK int64_t k_path_slack_tree(const bc_eng *e, int64_t c, int64_t d)
{
    int64_t xlim[BC_LIMITS], left;
    return k_unmet(e, c, d)
        + k_path_at((bc_eng *)e, c, d, 0, 0, 0, xlim, &left, NULL);   /* (writes nothing) */
}

static inline int64_t k_path_slack(const bc_eng *e, int64_t c, int64_t d)
{
    int64_t i = c * e->D + d;
    if (__builtin_expect(e->cd[i].up == 0, 1))
        return bc_slack(e->cd[i].g, e->cd[i].Hf, 0);
    return k_path_slack_tree(e, c, d);
}

/* §14.3, §4.4 Σ over c's path of g_v − Σ_ch g_ch: what an empty pool (every R_v = g_v)
 * leaves a firm grant to c beyond the top-level guarantees (g, for a flat campaign). */
BC_WALK int64_t k_path_free_g(const bc_eng *e, int64_t c, int64_t d)
{
    int64_t D = e->D, i = c * D + d, up = e->cd[i].up, sum = e->cd[i].g - e->gch[i];
    while (up > 0) {
        i = (up - 1) * D + d;
        sum += e->cd[i].g - e->gch[i];
        up = e->cd[i].up;
    }
    return sum;
}

/* §14.3 the children's commitments Rch of node `up` (see BC_UP_ROOT; <= 0: none, the pool)
 * move by dr on d, and each ancestor's with its child's change of R, as far as a change
 * reaches. The change of the top-level ancestor's R (dr itself when up <= 0; 0 if it stopped
 * below). */
BC_WALK int64_t k_commit_up(bc_eng *e, int64_t up, int64_t d, int64_t dr)
{
    int64_t i, hf, rch, g;
    while (up > 0 && dr != 0) {
        i = (up - 1) * e->D + d;
        g = e->cd[i].g;
        hf = e->cd[i].Hf;
        rch = e->cd[i].Rch;
        e->cd[i].Rch = rch + dr;
        dr = bc_commitment(g, hf, rch + dr) - bc_commitment(g, hf, rch);
        up = e->cd[i].up;
    }
    return dr;
}

/* §14.2, §14.8 the holding below node `up` (<= 0: none, the pool) moved by dh on d, df of it
 * firm, and what a child adds to its load by dm: every ancestor's subtree holding moves by
 * dh and its descendants' firm holding by df, and its load K (H) and Xch by what its child
 * adds, as far as a change reaches (df != 0 only with dh); a bucket is settled at t before
 * its load moves (its refill follows it). */
BC_WALK void k_measure_up(bc_eng *e, int64_t up, int64_t d, int64_t dh, int64_t dm, int64_t df,
                          int64_t t)
{
    int64_t i, h, g;
    while (up > 0 && (dh != 0 || dm != 0)) {
        i = (up - 1) * e->D + d;
        e->Hsub[i] += dh;
        if (df != 0)
            e->bor[i * BC_BOR_NCOL + BC_BOR_FSUB] += df;
        if (dm != 0) {
            k_settle(e, up - 1, d, t);
            h = e->cd[i].H;
            g = e->cd[i].g;
            e->cd[i].Xch += dm;
            e->cd[i].H = h + dm;
            dm = bc_rise_through(g, h, dm);
        }
        up = e->cd[i].up;
    }
}

/* §14.1 the largest guarantee a new child of node p may have on d now without raising the
 * load of a node of p's path above that node's sustained rate (a registration pays no
 * tokens): its reserved g raises the loads as a grant of g to p would, each node absorbing
 * the part of its guarantee its load does not use. */
BC_WALK int64_t k_child_load_room(const bc_eng *e, int64_t p, int64_t d)
{
    int64_t i, up = p + 1, absorbed = 0, room = BC_MAXV, r;
    while (up > 0) {
        i = (up - 1) * e->D + d;
        r = absorbed + bc_sustained_room(e->cd[i].H, e->cd[i].s);
        room = r < room ? r : room;
        absorbed += bc_unmet(e->cd[i].g, e->cd[i].H);
        up = e->cd[i].up;
    }
    return room;
}

/* §14.1 the most a new node under p (< 0: at the top level) may be guaranteed on d now:
 * a node of R = g raises Σ_top R as a firm grant of g to p would. */
static inline int64_t k_child_room(const bc_eng *e, int64_t p, int64_t d)
{
    return bc_firm_limit(e->cap[d], e->F[d], e->U[d], p < 0 ? 0 : k_path_slack(e, p, d));
}

/* §14.1, §14.8 node c joins the list of node p's children (p < 0: of the top-level nodes),
 * at its head: O(1), once per node, at its registration. A removed node stays listed (its
 * guarantee of 0 lends nothing). */
static inline void k_enlist(bc_eng *e, int64_t c, int64_t p)
{
    int64_t *ps = e->sib + (p + 1) * BC_SIB_NCOL, head = ps[BC_SIB_CHILD];
    e->sib[(c + 1) * BC_SIB_NCOL + BC_SIB_NEXT] = head != 0 ? head : -1;
    ps[BC_SIB_CHILD] = c + 1;
}

/* The first of node p's children (p < 0: of the top-level nodes), or < 0: none. */
static inline int64_t k_first_child(const bc_eng *e, int64_t p)
{
    return e->sib[(p + 1) * BC_SIB_NCOL + BC_SIB_CHILD] - 1;
}

/* The sibling after node v in its list, or < 0: none. */
static inline int64_t k_next_sibling(const bc_eng *e, int64_t v)
{
    return e->sib[(v + 1) * BC_SIB_NCOL + BC_SIB_NEXT] - 1;
}

/* §14.1, §14.8 flat campaign c becomes the root of a tree (a parent at its first child, or
 * a flat borrower, whose decisions then take the tree's walk, which weighs borrowing, so a
 * flat campaign without a borrow limit pays nothing for it); nothing for a node of a tree.
 * Its figures stay a flat campaign's: its subtree's holding is its own and its descendants
 * hold nothing. The caller made room for what ancestors prepay (lex). */
static inline void k_make_root(bc_eng *e, int64_t c)
{
    int64_t d, i;
    if (e->cd[c * e->D].up != 0)
        return;
    for (d = 0; d < e->D; d++) {
        i = c * e->D + d;
        e->cd[i].up = BC_UP_ROOT;
        e->Hsub[i] = e->cd[i].H;
        e->bor[i * BC_BOR_NCOL + BC_BOR_FSUB] = 0;
    }
}

/* §14.1 node c (its records written; it holds nothing) becomes a child of node p at t: it
 * joins p's list of children (k_enlist), its guarantee their guarantees, its commitment
 * R_c = g_c their commitments (U follows Σ_top R) and its reserved guarantee the loads of
 * p's path. The caller checked the nesting and the rooms (k_child_room, k_child_load_room)
 * on every dimension. */
static inline void k_link(bc_eng *e, int64_t c, int64_t p, int64_t t)
{
    int64_t d, i, g;
    k_enlist(e, c, p);
    k_make_root(e, p);                  /* (its first child: p becomes a tree's root) */
    for (d = 0; d < e->D; d++) {
        i = c * e->D + d;
        g = e->cd[i].g;
        e->cd[i].up = p + 1;
        e->gch[p * e->D + d] += g;
        e->U[d] += k_commit_up(e, p + 1, d, g);
        k_measure_up(e, p + 1, d, 0, bc_child_measure(g, 0), 0, t);
    }
}

/* -- every level binds (§14.2) ------------------------------------------------------------ */

/* Node v's parent, or -1 for a top-level node. */
static inline int64_t k_parent_of(const bc_eng *e, int64_t v)
{
    int64_t up = e->cd[v * e->D].up;
    return up > 0 ? up - 1 : -1;
}

/* c's path, c first, to lv; its length (at most BC_TREE_DEPTH: registration keeps it so). */
static inline int k_path_of(const bc_eng *e, int64_t c, int64_t *lv)
{
    int j = 0;
    for (; c >= 0 && j < BC_TREE_DEPTH; c = k_parent_of(e, c))
        lv[j++] = c;
    return j;
}

/* §14.2 the units held by the leases of (c, d)'s subtree: its own for a flat campaign,
 * whose H is its holding; a node of a tree's H is its load K. */
static inline int64_t k_held(const bc_eng *e, int64_t c, int64_t d)
{
    int64_t i = c * e->D + d;
    return e->cd[i].up != 0 ? e->Hsub[i] : e->cd[i].H;
}

/* §14.2, §4.3 the least credits left over node c's path (BC_MAXV: no budget anywhere on
 * it): the budget that binds a cost escrowed in every one. */
BC_WALK int64_t k_path_left_tree(const bc_eng *e, int64_t c)
{
    int64_t left = e->cr[c].left;
    for (c = k_parent_of(e, c); c >= 0; c = k_parent_of(e, c))
        left = bc_min64(left, e->cr[c].left);
    return left;
}

/* The credits left that bind a charge to c (tree: c is a node of a tree). */
static inline int64_t k_path_left_at(const bc_eng *e, int64_t c, int tree)
{
    return tree > 0 ? k_path_left_tree(e, c) : e->cr[c].left;
}

/* §14.2 a grant of n units to node c on d for dur ns at t, charged `charge`: each ancestor
 * v (its bucket settled to t) prepays the rise of its load above its sustained rate,
 * excess(δ_v, K_v) · dur with δ_v = max(0, n − E_v), recorded in lex[] (nearest first, 0
 * beyond the top, BC_TREE_DEPTH − 1 entries: the lease's row of e->lex); and escrows the
 * charge in its budget. Before the loads move (k_hold_at). */
BC_WALK void k_grant_up(bc_eng *e, int64_t c, int64_t d, int64_t n, int64_t dur, int64_t t,
                        bc_i128 charge, int64_t *lex)
{
    int64_t D = e->D, i = c * D + d, v, x, ex;
    int j = 0;
    for (v = 0; v < BC_TREE_DEPTH - 1; v++)
        lex[v] = 0;
    x = bc_rise_through(e->cd[i].g, e->cd[i].H, n);
    for (v = k_parent_of(e, c); v >= 0; v = k_parent_of(e, v), j++) {
        k_settle(e, v, d, t);
        i = v * D + d;
        ex = e->scal[1] != 0 ? 0 : bc_excess(e->cd[i].H, x, e->cd[i].s);
        if (ex != 0)
            k_debit_tokens(e, i, (bc_i128)ex * dur);
        lex[j] = ex;
        if (charge != 0)
            k_escrow(e, v, charge);
        x = bc_rise_through(e->cd[i].g, e->cd[i].H, x);
    }
}

/* §14.2 lease row r of node c on d ends at t with `remaining` ns unused: each ancestor takes
 * back the tokens it prepaid for them (up to its bucket's size) and its escrow of the
 * lease's `price`, `back` of it to its budget. Before the loads move. */
BC_WALK void k_end_up(bc_eng *e, int64_t c, int64_t d, int64_t r, bc_i128 remaining,
                      int64_t price, bc_i128 back, int64_t t)
{
    const int64_t *lex = e->lex + r * (BC_TREE_DEPTH - 1);
    int64_t v;
    int j = 0;
    for (v = k_parent_of(e, c); v >= 0; v = k_parent_of(e, v), j++) {
        k_settle(e, v, d, t);
        if (lex[j] != 0)
            k_refund_tokens(e, v * e->D + d, (bc_i128)lex[j] * remaining);
        k_credit_back(e, v, price, back);
    }
}

/* §4.4, §14.2 whether a request of nmin units to node c could never be granted, every level
 * of its path at its most lenient: the loads of an idle tree (K_v = Σ of v's children's
 * guarantees, the smallest any state has, which leaves the largest E), an empty pool but for
 * the guarantees (q->g: Σ over the path of g_v less its children's), full buckets, escrows
 * refunded. Each rule in BC_LIMIT_* order at every level: a level v sees its idle load plus
 * the rise δ_v (as the flat rule sees its nmin: an idle load is within s_v, so the excess of
 * the rise above it is that of the sum above 0). The reason, or BC_REASON_NONE. */
BC_WALK int64_t k_never_tree(const bc_eng *e, int64_t c, int64_t d, int64_t nmin,
                             const bc_req *q0)
{
    bc_req q = *q0;
    int64_t lv[BC_TREE_DEPTH], at[BC_TREE_DEPTH], x = nmin, idle, i;
    int depth = k_path_of(e, c, lv), j, rule;
    for (j = 0; j < depth; j++) {
        i = lv[j] * e->D + d;
        idle = e->gch[i];
        at[j] = bc_cap_maxv((bc_i128)idle + x);
        x = bc_rise_through(e->cd[i].g, idle, x);
    }
    for (rule = 0; rule < BC_LIMITS; rule++) {
        if (rule == BC_LIMIT_CAPACITY) {
            if (bc_never_allows(&q, rule, nmin))
                return bc_limit_reason[rule];
            continue;
        }
        for (j = 0; j < depth; j++) {
            i = lv[j] * e->D + d;
            q.b = e->cd[i].b;
            q.s = e->cd[i].s;
            q.Bcap = e->cd[i].Bcap;
            q.left = e->cr[lv[j]].left;
            q.escrow = e->cr[lv[j]].escrow;
            if (bc_never_allows(&q, rule, rule == BC_LIMIT_CREDITS ? nmin : at[j]))
                return bc_limit_reason[rule];
        }
    }
    return BC_REASON_NONE;
}

/* ns until the bucket of record i covers a rise of x units of its load for dur ns: 0 when
 * it covers it now; -1 when it never will (it does not refill, or the need is beyond its
 * size: the refill stops there); in instant mode 1 while it refills (tokens are back as soon
 * as time moves). The caller settled the bucket. */
static inline bc_i128 k_level_wait(const bc_eng *e, int64_t i, int64_t x, int64_t dur)
{
    int64_t H = e->cd[i].H, s = e->cd[i].s, rate = bc_sustained_room(H, s);
    bc_i128 total = (bc_i128)bc_excess(H, x, s) * dur, need = total - e->cd[i].T;
    if (need <= 0)
        return 0;
    if (rate == 0)
        return -1;
    if (e->scal[1] != 0)
        return 1;
    if (total > e->cd[i].Bcap)
        return -1;
    return (need + rate - 1) / rate;
}

/* §4.4, §14.2 ns until every bucket on node c's path covers what a grant of n for dur ns
 * would take from it (the longest of their waits; their buckets settled), or -1 when one
 * never will or none needs to. */
BC_WALK bc_i128 k_token_wait_tree(bc_eng *e, int64_t c, int64_t d, int64_t n, int64_t dur,
                                  int64_t t)
{
    int64_t i, x = n;
    bc_i128 w, wait = 0;
    for (; c >= 0; c = k_parent_of(e, c)) {
        k_settle(e, c, d, t);
        i = c * e->D + d;
        w = k_level_wait(e, i, x, dur);
        if (w < 0)
            return -1;
        wait = w > wait ? w : wait;
        x = bc_rise_through(e->cd[i].g, e->cd[i].H, x);
    }
    return wait > 0 ? wait : -1;
}

/* -- borrowing (§14.8) --------------------------------------------------------------------- */

/* §14.8 what node v's subtree leaves idle of its guarantee on d: Σ of the slack over the
 * subtree, R_v less its own firm units and its descendants' (max(0, g − Hf) for a flat
 * campaign). */
static inline int64_t k_idle(const bc_eng *e, int64_t v, int64_t d)
{
    int64_t i = v * e->D + d;
    if (e->cd[i].up == 0)
        return bc_slack(e->cd[i].g, e->cd[i].Hf, 0);
    return bc_commitment(e->cd[i].g, e->cd[i].Hf, e->cd[i].Rch) - e->cd[i].Hf
        - e->bor[i * BC_BOR_NCOL + BC_BOR_FSUB];
}

/* §14.8 the units c's borrow limit on d leaves for another borrowed lease. */
static inline int64_t k_borrow_left(const bc_eng *e, int64_t c, int64_t d)
{
    const int64_t *b = e->bor + (c * e->D + d) * BC_BOR_NCOL;
    return b[BC_BOR_LIMIT] - b[BC_BOR_HELD];
}

/* §14.8 whether class k's request for (c, d) may borrow: a firm class, and c's borrowed
 * units below its borrow limit. */
static inline int k_borrower(const bc_eng *e, int64_t c, int64_t d, int64_t k)
{
    const int64_t *b = e->bor + (c * e->D + d) * BC_BOR_NCOL;
    return b[BC_BOR_LIMIT] > b[BC_BOR_HELD] && e->cls[k * BC_K_NCOL + BC_K_PREEMPT] == 0;
}

/* §14.8 the units a borrowed lease of node c may take on d beyond c's firm room: what its
 * siblings (the other children of its parent, or the other top-level nodes) leave idle of
 * their guarantees, each up to its lend limit, less what c and its siblings hold on
 * borrowed leases, and no more than c's borrow limit leaves (k_borrow_left). One pass over
 * c's parent's list of children (k_enlist), O(siblings): a cold path, taken only by a
 * borrower's request that its firm room cut short. */
BC_WALK int64_t k_borrow_room(const bc_eng *e, int64_t c, int64_t d)
{
    int64_t D = e->D, v, idle, lend = 0;
    const int64_t *b = e->bor + (c * D + d) * BC_BOR_NCOL, *x;
    int64_t room = k_borrow_left(e, c, d), lent = b[BC_BOR_HELD];
    if (room <= 0)
        return 0;
    for (v = k_first_child(e, k_parent_of(e, c)); v >= 0; v = k_next_sibling(e, v)) {
        if (v == c)
            continue;
        x = e->bor + (v * D + d) * BC_BOR_NCOL;
        idle = k_idle(e, v, d);
        lend += bc_min64(x[BC_BOR_LEND], idle);
        lent += x[BC_BOR_HELD];
    }
    return bc_max64(0, bc_min64(room, lend - lent));
}

/* -- the level that binds (§14.2) -------------------------------------------------------- */

/* §14.2 node v's figure for rule q on d, as a journal names the level that binds: its
 * ceiling (units), its bucket's tokens (unit·ns, as settled) or its credits left
 * (micro-credits); 0 for capacity or no node (v < 0). */
static inline int64_t k_level_figure(const bc_eng *e, int64_t v, int64_t d, int64_t q)
{
    if (v < 0)
        return 0;
    switch (q) {
    case BC_LIMIT_CEILING:
        return e->cd[v * e->D + d].b;
    case BC_LIMIT_TOKENS:
        return e->cd[v * e->D + d].T;
    case BC_LIMIT_CREDITS:
        return e->cr[v].left;
    }
    return 0;
}

/* The rule that decided a decision whose limits were lim (BC_LIMIT_*; -1: none), as a journal
 * record names it: the rule of a refusal's reason, or for a grant sized down (granted, n
 * below nmax) the rule with the smallest limit (the first of equals); none for a grant of
 * the whole request or a reason that is no rule. lim capped at BC_MAXV, as recorded. */
static inline int64_t k_binding_rule(const int64_t *lim, int granted, int64_t n, int64_t nmax,
                                     int64_t reason)
{
    int64_t q, best = 0;
    if (granted && n >= nmax)
        return -1;
    if (!granted && reason != BC_REASON_NONE) {
        for (q = 0; q < BC_LIMITS; q++)
            if (bc_limit_reason[q] == reason)
                return q;
        return -1;
    }
    for (q = 1; q < BC_LIMITS; q++)
        if (bc_cap_maxv(lim[q]) < bc_cap_maxv(lim[best]))
            best = q;
    return best;
}

/* §14.2 per rule q of the decision just taken (k_decide at t, nothing changed since) on a
 * request of class k for (c, d) for dur ns, spending at most max_spend: to lv[q] the node
 * whose limit bound it, to fig[q] that node's figure for the rule (k_level_figure). For a
 * flat campaign c itself; for a node of a tree the level of its path k_path_at names, but
 * for the credits c itself when the request's spending cap binds (a cap at most the least
 * budget on the path, or a class that runs free when broke); -1 for capacity, the pool's
 * rule. Read before a grant moves the figures. */
BC_WALK void k_levels_of(const bc_eng *e, int64_t c, int64_t d, int64_t k, int64_t dur,
                         int64_t max_spend, int64_t *lv, int64_t *fig)
{
    int64_t xlim[BC_LIMITS], left, q;
    if (e->cd[c * e->D + d].up != 0) {
        /* (settle 0: the walk writes nothing; the decision settled the path at t) */
        k_path_at((bc_eng *)e, c, d, dur, 0, 0, xlim, &left, lv);
        if (max_spend >= 0 && (e->cls[k * BC_K_NCOL + BC_K_FREEBROKE] != 0 || max_spend <= left))
            lv[BC_LIMIT_CREDITS] = c;
    } else {
        for (q = 0; q < BC_LIMITS; q++)
            lv[q] = q == BC_LIMIT_CAPACITY ? -1 : c;
    }
    for (q = 0; q < BC_LIMITS; q++)
        fig[q] = k_level_figure(e, lv[q], d, q);
}

/* -- changing a node (§14.9) --------------------------------------------------------------- */

/* §14.9 node c's guarantee on d becomes g at t, through the walks a registration takes: its
 * parent's Σ children g (gsum at the top level), the change of its commitment R up its path
 * (U follows Σ_top R; for a flat campaign U moves by the change of its unmet guarantee) and
 * the change of what it adds to its parent's load. The caller checked the nesting and, for
 * a raise, the rooms of its parent (k_child_room, k_child_load_room). */
static inline void k_change_g(bc_eng *e, int64_t c, int64_t d, int64_t g, int64_t t)
{
    int64_t i = c * e->D + d, g0 = e->cd[i].g, up = e->cd[i].up, hf = e->cd[i].Hf, rch, K, dr;
    if (g == g0)
        return;
    rch = up != 0 ? e->cd[i].Rch : 0;
    dr = bc_commitment(g, hf, rch) - bc_commitment(g0, hf, rch);
    e->cd[i].g = g;
    if (up > 0) {
        K = e->cd[i].H;
        e->gch[(up - 1) * e->D + d] += g - g0;
        e->U[d] += k_commit_up(e, up, d, dr);
        k_measure_up(e, up, d, 0, bc_child_measure(g, K) - bc_child_measure(g0, K), 0, t);
    } else {
        e->gsum[d] += g - g0;
        e->U[d] += dr;
    }
}

/* §14.9 node c's envelope becomes (g, s, b, Bcap, budget) at t: its buckets settled first,
 * its guarantees moved (k_change_g), its bucket sizes changed with its tokens clipped to
 * them, and its credits left moved by the change of its budget (both finite, or both
 * BC_MAXV: unlimited). Live leases keep what they were granted. The caller checked every
 * rule (g <= s <= b, the nesting, the rooms of a raise, a budget that leaves credits >= 0). */
static inline void k_change_node(bc_eng *e, int64_t c, const int64_t *g, const int64_t *s,
                                 const int64_t *b, const int64_t *Bcap, int64_t budget,
                                 int64_t t)
{
    int64_t d, i;
    for (d = 0; d < e->D; d++) {
        i = c * e->D + d;
        k_settle(e, c, d, t);
        k_change_g(e, c, d, g[d], t);
        e->cd[i].s = s[d];
        e->cd[i].b = b[d];
        e->cd[i].Bcap = Bcap[d];
        if (e->cd[i].T > Bcap[d])
            e->cd[i].T = Bcap[d];
    }
    if (budget != e->cr[c].budget) {
        e->cr[c].left += budget - e->cr[c].budget;
        e->cr[c].budget = budget;
    }
}

#endif /* BURSARCORE_TREE_H */
