/* Shared between src/io/metrics.c (files) and src/io/svg.c (the chart). */
#ifndef CT_IO_METRICS_INTERNAL_H
#define CT_IO_METRICS_INTERNAL_H

#include "ctrain/metrics.h"

#include <stdio.h>

/* All points of one tag, in the order recorded. */
typedef struct ct_mseries {
    char *tag;
    int64_t *step;
    double *val;
    size_t n, cap;
} ct_mseries;

/* Writes the chart of series[0..n) to f (no atomic handling here). Returns CT_ERR_NOMEM or
 * CT_OK; the caller checks f for write errors. */
ct_status ct_svg_chart_(FILE *f, const ct_mseries *series, int n, const char *title);

#endif
