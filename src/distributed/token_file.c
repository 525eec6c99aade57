/* The store token of a job whose ranks come from the environment (RANK, WORLD_SIZE,
 * MASTER_PORT from a script or another launcher, no CTRAIN_STORE_TOKEN): rank 0 makes one
 * up and leaves it in a file only this user can read; the other ranks, on the same machine
 * (the shm backend is single-machine), read it there. Another user who can reach the port
 * cannot read the file, so cannot get past HELLO.
 *
 * Directory: $XDG_RUNTIME_DIR/ctrain when that is set, else /tmp/ctrain-<uid>; it must be
 * a real directory owned by this user with no access for others (a directory prepared by
 * someone else in /tmp is refused, not used). File: store-<port>.token, mode 0600, written
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

ct_status ct_private_dir(char *dir, size_t n) {
    const char *xdg = ct_config_str(CT_CFG_XDG_RUNTIME_DIR);
    uid_t uid = getuid();
    if (xdg && *xdg == '/') snprintf(dir, n, "%s/ctrain", xdg);
    else snprintf(dir, n, "/tmp/ctrain-%u", (unsigned)uid);
    if (strlen(dir) + 32 >= n) return ct_error(CT_ERR_INVALID, "store token directory name too long: %s", dir);
    if (mkdir(dir, 0700) && errno != EEXIST)
        return ct_error(CT_ERR_IO, "cannot create the store token directory %s: %s", dir, strerror(errno));
    struct stat sb;
    if (lstat(dir, &sb)) return ct_error(CT_ERR_IO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode) || sb.st_uid != uid || (sb.st_mode & 077))
        return ct_error(CT_ERR_IO,
                        "%s is not a private directory of this user (owner %u, mode %03o): remove it, or set "
                        "CTRAIN_STORE_TOKEN on every rank",
                        dir, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 0777));
    return CT_OK;
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
