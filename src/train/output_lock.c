/* Two jobs writing one output directory overwrite each other's checkpoints and weights (a
 * restarted job beside the orphans of a killed one did exactly that). Rank 0 holds
 * output_dir/.lock for the trainer's lifetime. flock rather than "a pid in a file": the
 * lock goes with the process, so no pid reuse and no stale file after a crash; the pid is
 * written only for the message. */
#include "train/output_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* mkdir -p, naming the component that is in the way. */
static ct_status mkdir_p(const char *dir) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) return ct_error(CT_ERR_INVALID, "output directory name too long");
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p) continue;
        char saved = *p;
        *p = 0;
        struct stat sb;
        if (mkdir(buf, 0777) && errno != EEXIST) return ct_error(CT_ERR_IO, "cannot create %s: %s", buf, strerror(errno));
        if (stat(buf, &sb) || !S_ISDIR(sb.st_mode))
            return ct_error(CT_ERR_IO, "cannot create directory %s: %s exists and is not a directory", dir, buf);
        *p = saved;
        if (!saved) break;
    }
    return CT_OK;
}

ct_status ct_output_lock(const char *dir, int *fd_out) {
    *fd_out = -1;
    ct_status st = mkdir_p(dir);
    if (st) return st;
    char path[4200];
    snprintf(path, sizeof path, "%s/.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return ct_error(CT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        char pid[32] = "";
        ssize_t r = pread(fd, pid, sizeof pid - 1, 0);
        close(fd);
        if (r > 0) pid[r] = 0;
        pid[strcspn(pid, "\n")] = 0;
        if (e == EWOULDBLOCK)
            return ct_error(CT_ERR_INVALID,
                            "output directory %s is in use by another job (pid %s, still running): wait for it, stop it, "
                            "or choose another --output-dir",
                            dir, *pid ? pid : "?");
        return ct_error(CT_ERR_IO, "cannot lock %s: %s", path, strerror(e));
    }
    char line[32];
    int n = snprintf(line, sizeof line, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) || pwrite(fd, line, (size_t)n, 0) != n) {
        int e = errno;
        close(fd);
        return ct_error(CT_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    *fd_out = fd;
    return CT_OK;
}

void ct_output_unlock(int fd) {
    if (fd >= 0) close(fd); /* the file stays: unlinking would let two openers lock two inodes */
}
