/* What the C examples share: a status check that exits with the library's message, the
 * ABI check at start-up, and the count of handles left alive at the end. */
#ifndef HETSCHED_EXAMPLE_H
#define HETSCHED_EXAMPLE_H

#include <stdio.h>
#include <stdlib.h>

#include "hetsched.h"

/* Exits 1 with the call, its status and the calling thread's last error on failure. */
#define CHECK(call)                                                                      \
    do {                                                                                 \
        hs_status status_ = (call);                                                      \
        if (status_ != HS_OK) {                                                          \
            const char *message_ = hs_last_error();                                      \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,            \
                    hs_status_name(status_), message_ ? message_ : "(no message)");      \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

/* 0 when the loaded library speaks this header's ABI; 1 with a message otherwise. */
static inline int example_abi_mismatch(void) {
    if (hs_abi_version() == HS_ABI_VERSION) return 0;
    fprintf(stderr, "library ABI %u, header %u\n", hs_abi_version(), HS_ABI_VERSION);
    return 1;
}

/* 0 when every handle was destroyed; 1 with a message otherwise. */
static inline int example_handles_left(void) {
    size_t live = hs_live_handles();
    if (live == 0) return 0;
    fprintf(stderr, "%zu handles left alive\n", live);
    return 1;
}

#endif /* HETSCHED_EXAMPLE_H */
