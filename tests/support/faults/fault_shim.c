/* fault_shim: an LD_PRELOAD library that makes the Nth write-side call on files under a folder fail.
 *
 * It interposes libc's write, pwrite, writev, pwritev, fsync, fdatasync, ftruncate and close, so it
 * reaches what Python, h5py's HDF5 (pwrite) and torch's zip writer do alike. A call counts when its
 * file descriptor names a path under the armed folder (/proc/self/fd); the Nth such call fails with
 * the armed errno without doing anything (close still closes: Linux frees the descriptor whatever
 * close reports). "sticky" makes every later call fail too, as a full disk does. A negative errno
 * sends that signal instead, at the call, before it does anything: -9 is a kill -9 at exactly that
 * point of a run (the process never returns from the call).
 *
 * Controlled from the process itself (ctypes finds these symbols in the preloaded library):
 *   fault_arm(folder, nth, errno, sticky, ops)   ops: a mask of FAULT_* below; nth >= 1
 *   fault_disarm()
 *   fault_count()      calls counted since fault_arm (to learn how many points a run has)
 *   fault_fired()      1 if a failure was injected since fault_arm
 * or, for a whole child process, from its environment at start (fault_arm_from_environment(), which a
 * child forked from a process that preloaded it calls again):
 *   FAULT_DIR, FAULT_NTH, FAULT_ERRNO, FAULT_STICKY, FAULT_OPS.
 * Test-only code: tests/support/fault_injection.py builds it with the system's C compiler.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define FAULT_WRITE 1
#define FAULT_SYNC 2
#define FAULT_CLOSE 4
#define FAULT_TRUNCATE 8

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char folder[PATH_MAX];
static size_t folder_len = 0;
static long nth = 0, counted = 0;
static int err = 0, sticky = 0, ops = 0, fired = 0;

void fault_arm(const char *dir, long n, int e, int s, int o) {
  pthread_mutex_lock(&lock);
  strncpy(folder, dir, sizeof(folder) - 1);
  folder[sizeof(folder) - 1] = 0;
  folder_len = strlen(folder);
  while (folder_len > 1 && folder[folder_len - 1] == '/') folder[--folder_len] = 0;
  nth = n;
  err = e;
  sticky = s;
  ops = o;
  counted = 0;
  fired = 0;
  pthread_mutex_unlock(&lock);
}

void fault_disarm(void) {
  pthread_mutex_lock(&lock);
  folder_len = 0;
  pthread_mutex_unlock(&lock);
}

long fault_count(void) { return counted; }
int fault_fired(void) { return fired; }

/* armed as FAULT_* say, or disarmed where FAULT_DIR is unset: at load, and again in a child forked from a
 * process that loaded it (tests/support/process_server.py), whose environment is the child's own */
void fault_arm_from_environment(void) {
  const char *dir = getenv("FAULT_DIR");
  if (!dir || !*dir) {
    fault_disarm();
    return;
  }
  const char *n = getenv("FAULT_NTH"), *e = getenv("FAULT_ERRNO"), *s = getenv("FAULT_STICKY"),
             *o = getenv("FAULT_OPS");
  fault_arm(dir, n ? atol(n) : 1, e ? atoi(e) : ENOSPC, s ? atoi(s) : 1,
            o ? atoi(o) : (FAULT_WRITE | FAULT_SYNC | FAULT_CLOSE | FAULT_TRUNCATE));
}

__attribute__((constructor)) static void from_environment(void) { fault_arm_from_environment(); }

/* 1 when this call must fail (errno set), 0 to let it through */
static int should_fail(int fd, int op) {
  if (folder_len == 0 || !(ops & op)) return 0;
  char link[64], path[PATH_MAX];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t len = readlink(link, path, sizeof(path) - 1);
  if (len <= 0) return 0;
  path[len] = 0;
  if (strncmp(path, folder, folder_len) != 0 || (path[folder_len] != '/' && path[folder_len] != 0)) return 0;
  pthread_mutex_lock(&lock);
  int fail = 0;
  if (folder_len != 0) {
    counted++;
    if (nth > 0 && (counted == nth || (sticky && counted > nth))) {
      fail = 1;
      fired = 1;
    }
  }
  int e = err;
  pthread_mutex_unlock(&lock);
  if (fail && e < 0) kill(getpid(), -e); /* a negative errno: that signal instead (-9: kill -9 at this call) */
  if (fail) errno = e;
  return fail;
}

#define REAL(name) static __typeof__(&name) real_##name; if (!real_##name) real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *buf, size_t n) {
  REAL(write);
  if (should_fail(fd, FAULT_WRITE)) return -1;
  return real_write(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
  REAL(pwrite);
  if (should_fail(fd, FAULT_WRITE)) return -1;
  return real_pwrite(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
  REAL(pwrite64);
  if (should_fail(fd, FAULT_WRITE)) return -1;
  return real_pwrite64(fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
  REAL(writev);
  if (should_fail(fd, FAULT_WRITE)) return -1;
  return real_writev(fd, iov, cnt);
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
  REAL(pwritev);
  if (should_fail(fd, FAULT_WRITE)) return -1;
  return real_pwritev(fd, iov, cnt, off);
}

int fsync(int fd) {
  REAL(fsync);
  if (should_fail(fd, FAULT_SYNC)) return -1;
  return real_fsync(fd);
}

int fdatasync(int fd) {
  REAL(fdatasync);
  if (should_fail(fd, FAULT_SYNC)) return -1;
  return real_fdatasync(fd);
}

int ftruncate(int fd, off_t len) {
  REAL(ftruncate);
  if (should_fail(fd, FAULT_TRUNCATE)) return -1;
  return real_ftruncate(fd, len);
}

int ftruncate64(int fd, off_t len) {
  REAL(ftruncate64);
  if (should_fail(fd, FAULT_TRUNCATE)) return -1;
  return real_ftruncate64(fd, len);
}

int close(int fd) {
  REAL(close);
  if (should_fail(fd, FAULT_CLOSE)) {
    int e = errno;
    real_close(fd); /* Linux releases the descriptor even when close reports an error */
    errno = e;
    return -1;
  }
  return real_close(fd);
}
