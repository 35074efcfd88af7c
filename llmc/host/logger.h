/* logger.h: the JSONL run log, one JSON object a line (docs/formats.md):
 *   {"type":"run", ...config and flags...}
 *   {"type":"step","step":s,"loss":..,"lr":..,"grad_norm":..,"ms":..,"tok_s":..,"k":..,"alarms":..,
 *    "injections":..,"replayed":..}
 *   {"type":"eval","step":s,"val_loss":..,"ppl":..,"tokens":..}
 *   {"type":"end","step":s,"weights":"<checksum>","reason":"done" | "SIGTERM" | ...}
 * Floats are printed with %.9g (float32 round-trips exactly), so a log compares bit for bit; NaN and
 * infinities as NaN / Infinity (jnum).
 * Only rank 0 writes. On resume the log is appended to. Each line is written and flushed at once, and
 * checked: a failed write (a full disk) stops the run with the file named (utils.h, StreamFile). */
#ifndef TSDC_LOGGER_H
#define TSDC_LOGGER_H

#include <stdio.h>
#include "utils.h"

typedef StreamFile Logger;

/* a number as JSON text: %.9g, or NaN / Infinity / -Infinity (what Python's json reads), since a
 * faulty run can produce them. Use as "%s" with jnum(x).s. */
typedef struct { char s[32]; } JNum;
static inline JNum jnum(double x) {
    JNum j;
    if (x != x) snprintf(j.s, sizeof(j.s), "NaN");
    else if (x > 1.7976931348623157e308) snprintf(j.s, sizeof(j.s), "Infinity");
    else if (x < -1.7976931348623157e308) snprintf(j.s, sizeof(j.s), "-Infinity");
    else snprintf(j.s, sizeof(j.s), "%.9g", x);
    return j;
}

static void logger_open(Logger* lg, const char* path, int append) { streamfile_open(lg, path, append, "the log"); }
static void logger_line(Logger* lg, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    streamfile_vline(lg, fmt, ap);
    va_end(ap);
}
static void logger_close(Logger* lg) { streamfile_close(lg); }

#endif
