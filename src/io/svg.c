/* The metrics chart: a self-contained SVG, one panel per metric name, a polyline per tag.
 * Plain attributes only (no CSS, scripts or external fonts) so browsers, rsvg and editors
 * all draw it the same. */

#include "io/metrics_internal.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Above this many finite points a tag is drawn as min/max per bucket: a line with 10^6
 * vertices is slow to render and no more readable than 2,000. */
#define SVG_MAX_DRAW 10000
#define SVG_BUCKETS 1000
/* Few points (eval every N steps): mark each one, else a single eval is invisible. */
#define SVG_MARK_MAX 60

#define PANEL_W 540
#define PANEL_H 340
#define PAD 20
#define HEAD 70
#define ML 74   /* plot area margins inside a panel */
#define MR 20
#define MT 36
#define MB 50
#define FONT "DejaVu Sans, Helvetica, Arial, sans-serif"

static const char *palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

typedef struct { int64_t step; double v; size_t ord; } pt;

typedef struct {
    pt *p;       /* sorted by step, non-finite values kept (they break the line) */
    size_t n;
    size_t nfinite;
    double last; /* last finite value by step */
} prepared;

static int pt_cmp(const void *a, const void *b) {
    const pt *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->ord < y->ord ? -1 : x->ord > y->ord;
}

static const char *family_of(const char *tag) {
    const char *s = strrchr(tag, '/');
    return s && s[1] ? s + 1 : tag;
}

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
        }
    }
}

/* 1, 2, 2.5, 5 x 10^k: ticks people can read at a glance. */
static double nice_step(double range, int target) {
    double raw = range / target;
    if (!(raw > 0)) return 1;
    double mag = pow(10, floor(log10(raw)));
    double r = raw / mag;
    double nice = r <= 1 ? 1 : r <= 2 ? 2 : r <= 2.5 ? 2.5 : r <= 5 ? 5 : 10;
    return nice * mag;
}

/* Widen [lo, hi] to tick multiples; a flat series gets a band around its value. */
static void axis_range(double *lo, double *hi, double *ts, int target, bool integer) {
    if (*hi - *lo <= 0 || !isfinite(*hi - *lo)) {
        double d = fabs(*lo) * 0.1;
        if (d == 0 || !isfinite(d)) d = 1;
        *lo -= d;
        *hi += d;
    }
    *ts = nice_step(*hi - *lo, target);
    if (integer && *ts < 1) *ts = 1;
    *lo = floor(*lo / *ts + 1e-9) * *ts;
    *hi = ceil(*hi / *ts - 1e-9) * *ts;
    if (*hi <= *lo) *hi = *lo + *ts;
}

static void fmt_tick(char *out, size_t n, double v, double ts, double absmax) {
    if (fabs(v) < ts * 1e-6) { snprintf(out, n, "0"); return; }
    if (absmax < 1e-3) { snprintf(out, n, "%.3g", v); return; }
    const char *suf = "";
    double scale = 1;
    if (absmax >= 1e6) { scale = 1e6; suf = "M"; }
    else if (absmax >= 1e4) { scale = 1e3; suf = "k"; }
    double t = ts / scale;
    int d = 0;
    while (d < 8 && fabs(t * pow(10, d) - round(t * pow(10, d))) > 1e-6 * t * pow(10, d)) d++;
    snprintf(out, n, "%.*f%s", d, v / scale, suf);
}

static void fmt_value(char *out, size_t n, double v) {
    if (!isfinite(v)) snprintf(out, n, "%s", isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
    else if (fabs(v) >= 1e5 || (fabs(v) < 1e-3 && v != 0)) snprintf(out, n, "%.3e", v);
    else snprintf(out, n, "%.4g", v);
}

static bool prepare(const ct_mseries *s, prepared *o) {
    memset(o, 0, sizeof *o);
    o->last = NAN;
    if (!s->n) return true;
    o->p = malloc(s->n * sizeof *o->p);
    if (!o->p) return false;
    bool sorted = true;
    for (size_t i = 0; i < s->n; i++) {
        o->p[i] = (pt){s->step[i], s->val[i], i};
        if (i && s->step[i] < s->step[i - 1]) sorted = false;
    }
    o->n = s->n;
    if (!sorted) qsort(o->p, o->n, sizeof *o->p, pt_cmp);
    for (size_t i = 0; i < o->n; i++)
        if (isfinite(o->p[i].v)) { o->nfinite++; o->last = o->p[i].v; }
    return true;
}

typedef struct {
    double px, py, pw, ph;      /* plot area */
    double xlo, xhi, ylo, yhi;
} frame;

static double fx(const frame *fr, double s) { return fr->px + (s - fr->xlo) / (fr->xhi - fr->xlo) * fr->pw; }
static double fy(const frame *fr, double v) { return fr->py + fr->ph - (v - fr->ylo) / (fr->yhi - fr->ylo) * fr->ph; }

/* Polylines of one tag: a new line after every non-finite value; above SVG_MAX_DRAW points,
 * each of SVG_BUCKETS step buckets contributes its min and max (in step order), which keeps
 * spikes visible. */
static void draw_tag(FILE *f, const frame *fr, const prepared *p, const char *color, const char *tag) {
    bool reduce = p->nfinite > SVG_MAX_DRAW;
    double bw = (fr->xhi - fr->xlo) / SVG_BUCKETS;
    fputs("<g><title>", f);
    xml_text(f, tag);
    fputs("</title>\n", f);
    size_t i = 0;
    while (i < p->n) {
        while (i < p->n && !isfinite(p->p[i].v)) i++;
        if (i >= p->n) break;
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" stroke-linejoin=\"round\" "
                   "stroke-linecap=\"round\" points=\"", color);
        bool first = true;
        while (i < p->n && isfinite(p->p[i].v)) {
            if (!reduce) {
                fprintf(f, "%s%.1f,%.1f", first ? "" : " ", fx(fr, (double)p->p[i].step), fy(fr, p->p[i].v));
                first = false;
                i++;
                continue;
            }
            long b = (long)floor(((double)p->p[i].step - fr->xlo) / bw);
            size_t lo = i, hi = i, j = i;
            while (j < p->n && isfinite(p->p[j].v) && (long)floor(((double)p->p[j].step - fr->xlo) / bw) == b) {
                if (p->p[j].v < p->p[lo].v) lo = j;
                if (p->p[j].v > p->p[hi].v) hi = j;
                j++;
            }
            size_t a = lo < hi ? lo : hi, c = lo < hi ? hi : lo;
            fprintf(f, "%s%.1f,%.1f", first ? "" : " ", fx(fr, (double)p->p[a].step), fy(fr, p->p[a].v));
            first = false;
            if (c != a) fprintf(f, " %.1f,%.1f", fx(fr, (double)p->p[c].step), fy(fr, p->p[c].v));
            i = j;
        }
        fputs("\"/>\n", f);
    }
    if (p->nfinite <= SVG_MARK_MAX)
        for (size_t k = 0; k < p->n; k++)
            if (isfinite(p->p[k].v))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.6\" fill=\"%s\"/>\n", fx(fr, (double)p->p[k].step),
                        fy(fr, p->p[k].v), color);
    fputs("</g>\n", f);
}

/* Points of the panel inside a box: used to put the legend where it hides the least. */
static size_t points_in(const frame *fr, const prepared *pp, const int *tags, int nt, double x0, double y0,
                        double w, double h) {
    size_t c = 0;
    for (int t = 0; t < nt; t++) {
        const prepared *p = &pp[tags[t]];
        size_t stride = p->n / 2000 + 1;
        for (size_t i = 0; i < p->n; i += stride) {
            if (!isfinite(p->p[i].v)) continue;
            double x = fx(fr, (double)p->p[i].step), y = fy(fr, p->p[i].v);
            if (x >= x0 && x <= x0 + w && y >= y0 && y <= y0 + h) c += stride;
        }
    }
    return c;
}

/* Every panel gets the same step axis (xmin..xmax over all tags) so panels line up: an eval
 * point sits under the training step it was taken at. */
static void draw_panel(FILE *f, double ox, double oy, const char *family, const ct_mseries *series,
                       const prepared *pp, const int *tags, int nt, double xmin, double xmax) {
    frame fr = {ox + ML, oy + MT, PANEL_W - ML - MR, PANEL_H - MT - MB, 0, 0, 0, 0};
    double ymin = INFINITY, ymax = -INFINITY;
    for (int t = 0; t < nt; t++) {
        const prepared *p = &pp[tags[t]];
        for (size_t i = 0; i < p->n; i++) {
            if (!isfinite(p->p[i].v)) continue;
            if (p->p[i].v < ymin) ymin = p->p[i].v;
            if (p->p[i].v > ymax) ymax = p->p[i].v;
        }
    }
    if (!(xmin <= xmax)) { xmin = 0; xmax = 1; }
    if (!(ymin <= ymax)) { ymin = 0; ymax = 1; }
    double xts, yts;
    fr.xlo = xmin; fr.xhi = xmax; fr.ylo = ymin; fr.yhi = ymax;
    axis_range(&fr.xlo, &fr.xhi, &xts, 6, true);
    axis_range(&fr.ylo, &fr.yhi, &yts, 5, false);

    fprintf(f, "<g>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" font-weight=\"bold\" fill=\"#222\">", fr.px,
            oy + 22);
    xml_text(f, family);
    fputs("</text>\n", f);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fbfbfb\" stroke=\"none\"/>\n",
            fr.px, fr.py, fr.pw, fr.ph);

    char lab[48];
    double xabs = fmax(fabs(fr.xlo), fabs(fr.xhi)), yabs = fmax(fabs(fr.ylo), fabs(fr.yhi));
    for (int k = 0;; k++) {
        double v = fr.xlo + k * xts;
        if (v > fr.xhi + xts * 1e-6) break;
        double x = fx(&fr, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>\n", x, fr.py, x,
                fr.py + fr.ph);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#666\"/>\n", x, fr.py + fr.ph,
                x, fr.py + fr.ph + 5);
        fmt_tick(lab, sizeof lab, v, xts, xabs);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#444\" text-anchor=\"middle\">%s</text>\n",
                x, fr.py + fr.ph + 18, lab);
    }
    for (int k = 0;; k++) {
        double v = fr.ylo + k * yts;
        if (v > fr.yhi + yts * 1e-6) break;
        double y = fy(&fr, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>\n", fr.px, y,
                fr.px + fr.pw, y);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#666\"/>\n", fr.px - 5, y,
                fr.px, y);
        fmt_tick(lab, sizeof lab, v, yts, yabs);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#444\" text-anchor=\"end\">%s</text>\n",
                fr.px - 8, y + 4, lab);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#888\"/>\n",
            fr.px, fr.py, fr.pw, fr.ph);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" fill=\"#333\" text-anchor=\"middle\">step</text>\n",
            fr.px + fr.pw / 2, fr.py + fr.ph + 38);
    fprintf(f, "<text transform=\"translate(%.1f %.1f) rotate(-90)\" font-size=\"12\" fill=\"#333\" "
               "text-anchor=\"middle\">", ox + 16, fr.py + fr.ph / 2);
    xml_text(f, family);
    fputs("</text>\n", f);

    /* Lines, clipped to the plot area (a point exactly on the frame stays visible). */
    fprintf(f, "<clipPath id=\"clip%.0f_%.0f\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n",
            ox, oy, fr.px - 4, fr.py - 4, fr.pw + 8, fr.ph + 8);
    fprintf(f, "<g clip-path=\"url(#clip%.0f_%.0f)\">\n", ox, oy);
    for (int t = 0; t < nt; t++)
        draw_tag(f, &fr, &pp[tags[t]], palette[tags[t] % 10], series[tags[t]].tag);
    fputs("</g>\n", f);

    /* Legend: tag and last value, top right unless the data is there, then bottom right. */
    size_t maxc = 0;
    char val[32];
    for (int t = 0; t < nt; t++) {
        fmt_value(val, sizeof val, pp[tags[t]].last);
        size_t c = strlen(series[tags[t]].tag) + strlen(val) + 2;
        if (c > maxc) maxc = c;
    }
    double lw = 34 + maxc * 6.9, lh = 10 + 18.0 * nt;
    double lx = fr.px + fr.pw - lw - 8, ly_top = fr.py + 8, ly_bot = fr.py + fr.ph - lh - 8;
    double ly = points_in(&fr, pp, tags, nt, lx, ly_bot, lw, lh) < points_in(&fr, pp, tags, nt, lx, ly_top, lw, lh)
                    ? ly_bot : ly_top;
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" rx=\"4\" fill=\"#ffffff\" "
               "fill-opacity=\"0.88\" stroke=\"#cccccc\"/>\n", lx, ly, lw, lh);
    for (int t = 0; t < nt; t++) {
        double y = ly + 14 + 18.0 * t;
        const char *col = palette[tags[t] % 10];
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"/>\n",
                lx + 8, y - 4, lx + 26, y - 4, col);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" fill=\"#222\">", lx + 32, y);
        xml_text(f, series[tags[t]].tag);
        fmt_value(val, sizeof val, pp[tags[t]].last);
        fprintf(f, " <tspan fill=\"#777\">%s</tspan></text>\n", val);
    }
    fputs("</g>\n", f);
}

ct_status ct_svg_chart_(FILE *f, const ct_mseries *series, int n, const char *title) {
    prepared *pp = calloc(n ? (size_t)n : 1, sizeof *pp);
    int *fam = malloc((n ? (size_t)n : 1) * sizeof *fam);     /* family index per tag */
    int *famfirst = malloc((n ? (size_t)n : 1) * sizeof *famfirst); /* first tag of each family */
    int *tags = malloc((n ? (size_t)n : 1) * sizeof *tags);
    ct_status st = CT_OK;
    if (!pp || !fam || !famfirst || !tags) { st = ct_error(CT_ERR_NOMEM, "metrics: out of memory drawing chart"); goto done; }
    for (int i = 0; i < n; i++)
        if (!prepare(&series[i], &pp[i])) { st = ct_error(CT_ERR_NOMEM, "metrics: out of memory drawing chart"); goto done; }

    int nfam = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < nfam && strcmp(family_of(series[famfirst[k]].tag), family_of(series[i].tag))) k++;
        if (k == nfam) famfirst[nfam++] = i;
        fam[i] = k;
    }
    int cols = nfam <= 1 ? 1 : 2, rows = nfam ? (nfam + cols - 1) / cols : 1;
    int W = cols * PANEL_W + 2 * PAD, H = HEAD + rows * PANEL_H + PAD;
    int64_t last = 0;
    double xmin = INFINITY, xmax = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (!pp[i].n) continue;
        if (pp[i].p[pp[i].n - 1].step > last) last = pp[i].p[pp[i].n - 1].step;
        for (size_t k = 0; k < pp[i].n; k++)
            if (isfinite(pp[i].p[k].v)) {
                xmin = fmin(xmin, (double)pp[i].p[k].step);
                xmax = fmax(xmax, (double)pp[i].p[k].step);
            }
    }

    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"%s\">\n", W, H, W, H, FONT);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", W, H);
    fprintf(f, "<text x=\"%d\" y=\"34\" font-size=\"20\" font-weight=\"bold\" fill=\"#111\" text-anchor=\"middle\">",
            W / 2);
    xml_text(f, title);
    fputs("</text>\n", f);
    fprintf(f, "<text x=\"%d\" y=\"54\" font-size=\"12\" fill=\"#777\" text-anchor=\"middle\">", W / 2);
    if (n) fprintf(f, "%d series, up to step %lld", n, (long long)last);
    else fputs("no metrics recorded", f);
    fputs("</text>\n", f);
    for (int k = 0; k < nfam; k++) {
        int nt = 0;
        for (int i = 0; i < n; i++) if (fam[i] == k) tags[nt++] = i;
        double ox = PAD + (k % cols) * PANEL_W, oy = HEAD + (k / cols) * PANEL_H;
        draw_panel(f, ox, oy, family_of(series[famfirst[k]].tag), series, pp, tags, nt, xmin, xmax);
    }
    fputs("</svg>\n", f);
done:
    if (pp) for (int i = 0; i < n; i++) free(pp[i].p);
    free(pp);
    free(fam);
    free(famfirst);
    free(tags);
    return st;
}
