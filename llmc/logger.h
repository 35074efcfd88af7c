/* logger.h: the JSONL run log, one JSON object a line (DESIGN.md section 9):
 *   {"type":"run", ...config and flags...}
 *   {"type":"step","step":s,"loss":..,"lr":..,"grad_norm":..,"ms":..,"tok_s":..,"k":..,"alarms":..,
 *    "injections":..,"replayed":..}
 *   {"type":"eval","step":s,"val_loss":..,"ppl":..,"tokens":..}
 * Floats are printed with %.9g (float32 round-trips exactly), so a log compares bit for bit; NaN and
 * infinities as NaN / Infinity (jnum).
 * Only rank 0 writes. On resume the log is appended to. Each line is flushed as it is written. */
#ifndef TSDC_LOGGER_H
#define TSDC_LOGGER_H

#include <stdio.h>
#include "utils.h"

typedef struct { FILE* fp; char path[2048]; } Logger;

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

static void logger_open(Logger* lg, const char* path, int append) {
    snprintf(lg->path, sizeof(lg->path), "%s", path);
    lg->fp = fopen(path, append ? "a" : "w");
    if (!lg->fp) tsdc_fail("%s: cannot open log for writing: %s", path, strerror(errno));
}
static void logger_line(Logger* lg, const char* fmt, ...) {
    if (!lg->fp) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(lg->fp, fmt, ap);
    va_end(ap);
    fputc('\n', lg->fp);
    fflush(lg->fp);
}
static void logger_close(Logger* lg) { if (lg->fp) fclose(lg->fp); lg->fp = NULL; }

#endif
