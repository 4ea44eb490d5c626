/* message.c: the one way a runtime function that fails says why: a formatted line
 * into the caller's buffer, and false to return. */
#include <stdarg.h>
#include <stdio.h>

#include "runtime.h"

bool ddp_fail(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return false;
}
