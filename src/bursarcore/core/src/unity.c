/* The whole core as one translation unit, for a binding that compiles it into itself
 * (the Cython extension): its calls into the ABI can then be inlined. */
#include "core.c"
#include "buckets.c"
#include "engine.c"
