/* Logging: CTRAIN_DEBUG picks the level (default WARN), CTRAIN_DEBUG_SUBSYS a comma list
 * of subsystems to show at INFO/TRACE (default all). Lines carry time and rank. */

#include "ctrain/config.h"
#include "ctrain/core.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int log_level = -1;
static char log_subsys[256];
static int log_rank = -1;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_init(void) {
    /* choices are ERROR|WARN|INFO|TRACE, in ct_log_level's order */
    log_level = ct_config_choice(CT_CFG_DEBUG);
    const char *ss = ct_config_str(CT_CFG_DEBUG_SUBSYS);
    if (ss) snprintf(log_subsys, sizeof log_subsys, "%s", ss);
    if (log_rank < 0 && ct_config_is_set(CT_CFG_RANK)) log_rank = (int)ct_config_int(CT_CFG_RANK);
}

void ct_log_set_rank(int rank) { log_rank = rank; }

static int subsys_match(const char *subsys) {
    if (!log_subsys[0] || !subsys) return 1;
    size_t n = strlen(subsys);
    const char *p = log_subsys;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if ((len == n && !strncasecmp(p, subsys, n)) || (len == 3 && !strncasecmp(p, "all", 3))) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

int ct_log_enabled(ct_log_level lvl, const char *subsys) {
    pthread_once(&log_once, log_init);
    if ((int)lvl > log_level) return 0;
    return lvl <= CT_LOG_WARN || subsys_match(subsys);
}

void ct_log(ct_log_level lvl, const char *subsys, const char *fmt, ...) {
    if (!ct_log_enabled(lvl, subsys)) return;
    static const char *lname[] = {"ERROR", "WARN", "INFO", "TRACE"};
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char line[2300];
    int n;
    if (log_rank >= 0)
        n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03d [rank %d] ctrain %s %s: %s\n", tm.tm_hour, tm.tm_min,
                     tm.tm_sec, (int)(tv.tv_usec / 1000), log_rank, lname[lvl], subsys ? subsys : "-", msg);
    else
        n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03d ctrain %s %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (int)(tv.tv_usec / 1000), lname[lvl], subsys ? subsys : "-", msg);
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    /* one write() per line so lines from threads and ranks do not interleave */
    ssize_t w = write(2, line, (size_t)n);
    (void)w;
}
