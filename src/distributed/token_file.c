/* The store token of a job whose ranks come from the environment (RANK, WORLD_SIZE,
 * MASTER_PORT from a script or another launcher, no CTRAIN_STORE_TOKEN): rank 0 makes one
 * up and leaves it in a file only this user can read; the other ranks, on the same machine
 * (the shm backend is single-machine), read it there. Another user who can reach the port
 * cannot read the file, so cannot get past HELLO.
 *
 * Directory: $CTRAIN_RUNTIME_DIR when set, else $XDG_RUNTIME_DIR/ctrain, else
 * /tmp/ctrain-<uid>, or $HOME/.cache/ctrain when another user already made that one; it
 * must be a real directory owned by this user with no access for others (a directory
 * prepared by someone else is refused, not used). File: store-<port>.token, mode 0600, written
 * under a temporary name and renamed, so a reader sees the old token or the new one. */
#include "distributed/dist_internal.h"
#include "ctrain/config.h"
#include "ctrain/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Makes `dir` (0700) unless it exists; on failure `why` says what is wrong with it. A
 * directory that is not a real directory of this user closed to others is refused, never
 * used or "repaired": another user may have made it to read or plant our tokens. */
static int own_private_dir(const char *dir, char *why, size_t wn) {
    if (mkdir(dir, 0700) && errno != EEXIST) {
        snprintf(why, wn, "cannot create it: %s", strerror(errno));
        return 0;
    }
    struct stat sb;
    if (lstat(dir, &sb)) {
        snprintf(why, wn, "%s", strerror(errno));
        return 0;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(why, wn, "not a directory%s", S_ISLNK(sb.st_mode) ? " (a symbolic link)" : "");
        return 0;
    }
    if (sb.st_uid != getuid() || (sb.st_mode & 077)) {
        snprintf(why, wn, "not a private directory of this user (owner %u, mode %03o)", (unsigned)sb.st_uid,
                 (unsigned)(sb.st_mode & 0777));
        return 0;
    }
    return 1;
}

ct_status ct_private_dir(char *dir, size_t n) {
    char why[160];
    const char *mine = ct_config_str(CT_CFG_RUNTIME_DIR);
    if (mine && *mine) {
        if (*mine != '/') return ct_error(CT_ERR_INVALID, "CTRAIN_RUNTIME_DIR=%s must be an absolute path", mine);
        snprintf(dir, n, "%s", mine);
        if (strlen(dir) + 32 >= n) return ct_error(CT_ERR_INVALID, "CTRAIN_RUNTIME_DIR is too long: %s", mine);
        if (own_private_dir(dir, why, sizeof why)) return CT_OK;
        return ct_error(CT_ERR_IO, "CTRAIN_RUNTIME_DIR=%s: %s: choose a directory of yours with mode 0700", dir, why);
    }
    const char *xdg = ct_config_str(CT_CFG_XDG_RUNTIME_DIR);
    uid_t uid = getuid();
    int tmp_default = !(xdg && *xdg == '/');
    if (!tmp_default) snprintf(dir, n, "%s/ctrain", xdg);
    else snprintf(dir, n, "/tmp/ctrain-%u", (unsigned)uid);
    if (strlen(dir) + 32 >= n) return ct_error(CT_ERR_INVALID, "store token directory name too long: %s", dir);
    if (own_private_dir(dir, why, sizeof why)) return CT_OK;
    /* Any local user can make /tmp/ctrain-<uid> first, and only root could remove it. The
     * ranks of one job share the user, HOME and environment, so they all land on the same
     * fallback, which others cannot pre-create. */
    const char *home = ct_config_str(CT_CFG_HOME);
    char alt[512] = "", alt_why[160] = "";
    if (tmp_default && home && *home == '/') {
        snprintf(alt, sizeof alt, "%s/.cache", home);
        (void)mkdir(alt, 0700); /* its parent only: ctrain/ below is the one checked */
        snprintf(alt, sizeof alt, "%s/.cache/ctrain", home);
        if (strlen(alt) + 32 < n && own_private_dir(alt, alt_why, sizeof alt_why)) {
            static int warned;
            if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
                CT_LOG_WARN_("store", "%s: %s; using %s instead (set CTRAIN_RUNTIME_DIR to choose)", dir, why, alt);
            snprintf(dir, n, "%s", alt);
            return CT_OK;
        }
    }
    char dflt[512];
    snprintf(dflt, sizeof dflt, "%s", dir);
    if (alt[0])
        return ct_error(CT_ERR_IO, "%s: %s; the fallback %s: %s: set CTRAIN_RUNTIME_DIR to a directory of yours (mode 0700)",
                        dflt, why, alt, alt_why);
    return ct_error(CT_ERR_IO, "%s: %s: set CTRAIN_RUNTIME_DIR to a directory of yours (mode 0700), or remove it", dflt,
                    why);
}

ct_status ct_token_file_path(int port, char *path, size_t n) {
    char dir[512];
    ct_status st = ct_private_dir(dir, sizeof dir);
    if (st) return st;
    snprintf(path, n, "%s/store-%d.token", dir, port);
    return CT_OK;
}

/* A new random token in <private dir>/<prefix><port><suffix>, written under a temporary
 * name and renamed (a reader sees the old token or the new one). */
static ct_status publish(const char *prefix, int port, const char *suffix, char *token, size_t n, char *path, size_t pn) {
    if (n < 33) return ct_error(CT_ERR_INVALID, "token buffer too small");
    char dir[512];
    ct_status st = ct_private_dir(dir, sizeof dir);
    if (st) return st;
    snprintf(path, pn, "%s/%s%d%s", dir, prefix, port, suffix);
    ct_random_hex(token, 16);
    char tmp[600], hex[16];
    ct_random_hex(hex, 4);
    snprintf(tmp, sizeof tmp, "%s.%s.tmp", path, hex);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return ct_error(CT_ERR_IO, "cannot write the store token %s: %s", tmp, strerror(errno));
    size_t len = strlen(token);
    int bad = write(fd, token, len) != (ssize_t)len;
    bad |= close(fd) != 0;
    if (bad || rename(tmp, path)) {
        int e = errno;
        unlink(tmp);
        return ct_error(CT_ERR_IO, "cannot write the store token %s: %s", path, strerror(e));
    }
    return CT_OK;
}

ct_status ct_token_file_publish(int port, char *token, size_t n, char *path, size_t pn) {
    return publish("store-", port, ".token", token, n, path, pn);
}

ct_status ct_store_secret_publish(int port, char *token, size_t n, char *path, size_t pn) {
    return publish("rdzv-", port, ".secret", token, n, path, pn);
}

ct_status ct_store_secret_read_file(const char *path, char *token, size_t n) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block us */
    if (fd < 0)
        return ct_error(CT_ERR_INVALID, "cannot read the store secret file %s: %s%s", path, strerror(errno),
                        errno == ELOOP ? " (a symbolic link: give the file itself)" : "");
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode) || sb.st_uid != getuid() || (sb.st_mode & 077)) {
        close(fd);
        if (!S_ISREG(sb.st_mode)) return ct_error(CT_ERR_INVALID, "store secret file %s is not a regular file", path);
        return ct_error(CT_ERR_INVALID,
                        "store secret file %s is readable by others or not this user's (owner %u, mode %03o): "
                        "chown it and chmod 600 it",
                        path, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 0777));
    }
    char buf[300];
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r < 0) return ct_error(CT_ERR_IO, "cannot read the store secret file %s: %s", path, strerror(errno));
    size_t len = (size_t)r;
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) len--;
    if (len < 16 || len > 255 || memchr(buf, '\n', len) || memchr(buf, 0, len) || len + 1 > n)
        return ct_error(CT_ERR_INVALID, "store secret file %s must hold one line of 16 to 255 bytes (it has %zu%s)",
                        path, len, len > 255 ? " or more" : "");
    memcpy(token, buf, len);
    token[len] = 0;
    memset(buf, 0, sizeof buf);
    return CT_OK;
}

ct_status ct_token_file_read(int port, char *token, size_t n) {
    char path[600];
    ct_status st = ct_token_file_path(port, path, sizeof path);
    if (st) return st;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return CT_ERR_NOT_FOUND; /* rank 0 has not written it yet: not an error message */
        return ct_error(CT_ERR_IO, "cannot read the store token %s: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode) || sb.st_uid != getuid() || (sb.st_mode & 077)) {
        close(fd);
        return ct_error(CT_ERR_IO, "%s is not a private file of this user: not using it", path);
    }
    ssize_t r = read(fd, token, n - 1);
    close(fd);
    if (r <= 0) return CT_ERR_NOT_FOUND;
    token[r] = 0;
    return CT_OK;
}
