/* Preemption: Slurm and Kubernetes send SIGTERM before they take a node (Slurm's --signal
 * can send SIGUSR1 earlier). The handlers only record the signal; the trainer reads the
 * record after each step, the ranks agree on the step to stop at, and a checkpoint is
 * written there (trainer.c). */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "ctrain/train.h"

static volatile sig_atomic_t caught;

static void on_signal(int sig) {
    if (!caught) caught = sig;
}

static const struct {
    const char *name;
    int sig;
} NAMES[] = {{"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"INT", SIGINT}, {"HUP", SIGHUP}, {"XCPU", SIGXCPU}};

ct_status ct_preempt_parse(const char *spec, uint64_t *mask) {
    *mask = 0;
    if (!spec || !*spec || !strcasecmp(spec, "none")) return CT_OK;
    const char *p = spec;
    while (*p) {
        while (*p == ',' || *p == ' ') p++;
        if (!*p) break;
        size_t n = strcspn(p, ", ");
        char w[16];
        snprintf(w, sizeof w, "%.*s", (int)(n < sizeof w - 1 ? n : sizeof w - 1), p);
        const char *name = strncasecmp(w, "SIG", 3) ? w : w + 3;
        int sig = 0;
        for (size_t i = 0; i < sizeof NAMES / sizeof *NAMES && !sig; i++)
            if (!strcasecmp(name, NAMES[i].name)) sig = NAMES[i].sig;
        if (!sig)
            return ct_error(CT_ERR_INVALID, "CTRAIN_PREEMPT_SIGNALS: '%.*s' is not one of TERM, USR1, USR2, INT, HUP, XCPU "
                            "(a comma list, or none)", (int)n, p);
        *mask |= 1ull << sig;
        p += n;
    }
    return CT_OK;
}

ct_status ct_preempt_catch(uint64_t mask) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART; /* the step goes on: reads and waits resume after the handler */
    sigemptyset(&sa.sa_mask);
    for (int s = 1; s < 64; s++)
        if ((mask >> s & 1) && sigaction(s, &sa, NULL))
            return ct_error(CT_ERR_SYSTEM, "cannot catch signal %d (%s): %s", s, strsignal(s), strerror(errno));
    return CT_OK;
}

int ct_preempt_signal(void) { return caught; }

void ct_preempt_request(int sig) {
    if (!caught) caught = sig;
}
