/* The library's identity and its status messages. */
#include "bursarcore.h"

int bc_abi_version(void)
{
    return BURSARCORE_ABI_VERSION;
}

const char *bc_strerror(int status)
{
    switch (status) {
    case BC_OK: return "ok";
    case BC_EINVAL: return "invalid argument (a NULL pointer or lengths that do not agree)";
    case BC_ERANGE: return "value out of range";
    case BC_EINDEX: return "index out of range";
    case BC_ETIME: return "time before the last update";
    case BC_ENOMEM: return "out of memory; nothing changed";
    case BC_ETOKENS: return "tokens above the capacity";
    default: return "unknown status";
    }
}
