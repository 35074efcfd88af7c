/* check.h: the reporting of the C and CUDA test programs (test_sdc.c, test_sdc.cu): each check prints its
 * line and OK / NOT OK, flushed at once (a crash later still shows every result before it), and is counted
 * in n_pass / n_fail for the last line, "N passed, M failed". */
#ifndef TSDC_TESTS_CHECK_H
#define TSDC_TESTS_CHECK_H

#include <stdarg.h>
#include <stdio.h>

static int n_pass = 0, n_fail = 0;

static void check(int ok, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("  %s\n", ok ? "OK" : "NOT OK");
    fflush(stdout);
    if (ok) n_pass++; else n_fail++;
}

#endif
