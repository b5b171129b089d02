/* _usdt: the sites (probes) of the process, the files that hold them, and
 * the removal of those files at exit (see usdt.h).
 */

#include "Python.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "usdt.h"

/* Everything below is shared by all interpreters and threads, and guarded
 * by registry_lock.  A pthread mutex, not a PyMutex: a thread waiting for a
 * PyMutex detaches from the interpreter and can be handed the lock while
 * the world is stopped for os.fork() in the free-threaded build, so the
 * child started with the lock held and hung at its first probe or at exit.
 * A thread waiting here stays attached, so fork() waits until no thread
 * holds the lock (nothing under it detaches or runs Python code). */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static int atfork_registered;
static struct site **sites;
static size_t site_count, site_capacity;
static struct object **objects;
static size_t object_count, object_capacity;
static unsigned long object_serial;
/* The directory of this process's files, and the process that made it:
 * after fork(), the child's first probe makes its own. */
static char directory[PATH_MAX];
static pid_t directory_owner;
static int atexit_registered;
/* Whether this process image (or the parent it was forked from) has
 * removed the stale directories of dead processes. */
static int stale_removed;

/* Remove the files this process wrote, then its directory (Py_AtExit). */
static void
remove_files(void)
{
    pid_t pid = getpid();
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < object_count; i++) {
        if (objects[i]->owner == pid) {
            (void)unlink(objects[i]->path);
        }
    }
    if (directory_owner == pid) {
        (void)rmdir(directory);
        directory_owner = 0;
    }
    pthread_mutex_unlock(&registry_lock);
}

/* pthread_atfork() child handler: the child has one thread, so the lock is
 * free in it even if a fork() that bypassed os.fork() (a C library's)
 * happened while another thread held it. */
static void
registry_atfork_child(void)
{
    pthread_mutex_init(&registry_lock, NULL);
}

static struct site *
find_site(const char *provider, const char *name)
{
    for (size_t i = 0; i < site_count; i++) {
        if (strcmp(sites[i]->name, name) == 0
            && strcmp(sites[i]->provider, provider) == 0)
        {
            return sites[i];
        }
    }
    return NULL;
}

/* *array* (of pointers, *capacity* of them) grown to hold *need*; NULL
 * if out of memory (then *array* is unchanged). */
static void *
grow(void *array, size_t *capacity, size_t need)
{
    if (need <= *capacity) {
        return array;
    }
    size_t cap = *capacity ? *capacity * 2 : 64;
    while (cap < need) {
        cap *= 2;
    }
    void *grown = realloc(array, cap * sizeof(void *));
    if (grown != NULL) {
        *capacity = cap;
    }
    return grown;
}

/* Why creating a site failed, for the caller to raise once the lock is
 * released. */
struct failure {
    PyObject *type;             /* NULL: no failure */
    int error;                  /* errno, for OSError */
    char message[PATH_MAX + 256];
};

static void
fail(struct failure *f, PyObject *type, int error, const char *format, ...)
{
    va_list va;
    f->type = type;
    f->error = error;
    va_start(va, format);
    vsnprintf(f->message, sizeof(f->message), format, va);
    va_end(va);
}

static void
raise_failure(const struct failure *f)
{
    if (f->type == PyExc_MemoryError) {
        PyErr_NoMemory();
    }
    else if (f->type == PyExc_OSError && f->error != 0) {
        PyObject *args = Py_BuildValue("(is)", f->error, f->message);
        if (args != NULL) {
            PyErr_SetObject(PyExc_OSError, args);
            Py_DECREF(args);
        }
    }
    else {
        PyErr_SetString(f->type, f->message);
    }
}

/* The identity of a process that outlives its pid: the pid namespace it
 * runs in (the inode of /proc/PID/ns/pid) and its start time (field 22 of
 * /proc/PID/stat, in clock ticks since boot).  A directory's name records
 * its owner's, so that a later process can tell whether the owner still
 * runs (see remove_stale_directories()). */
struct identity {
    unsigned long long start;
    unsigned long long pidns;
};

/* The start time of process pid into *start: 0 on success, else -1 with
 * errno (ENOENT or ESRCH: no such process). */
static int
read_start_time(pid_t pid, unsigned long long *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    ssize_t n;
    do {
        n = read(fd, buf, sizeof(buf) - 1);
    } while (n < 0 && errno == EINTR);
    int saved = errno;
    close(fd);
    if (n <= 0) {
        errno = n < 0 ? saved : ESRCH;
        return -1;
    }
    buf[n] = '\0';
    /* The command name (field 2) is in parentheses and may hold spaces
     * and parentheses itself: count the fields after the last ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL) {
        errno = EINVAL;
        return -1;
    }
    p++;
    for (int field = 3; field < 22; field++) {
        p = strchr(p + 1, ' ');
        if (p == NULL) {
            errno = EINVAL;
            return -1;
        }
    }
    char *end;
    errno = 0;
    *start = strtoull(p + 1, &end, 10);
    if (errno != 0 || end == p + 1) {
        errno = EINVAL;
        return -1;
    }
    return 0;
}

/* This process's identity: 0, or -1 when /proc does not tell it. */
static int
own_identity(struct identity *id)
{
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) < 0
        || read_start_time(getpid(), &id->start) < 0)
    {
        return -1;
    }
    id->pidns = (unsigned long long)st.st_ino;
    return 0;
}

/* Parse "python-usdt-PID-START-PIDNS-XXXXXX": 0, or -1 for any other name
 * (another program's, or an older version's, whose owner is unknown). */
static int
parse_directory_name(const char *name, pid_t *pid, struct identity *id)
{
    static const char prefix[] = "python-usdt-";
    if (strncmp(name, prefix, sizeof(prefix) - 1) != 0) {
        return -1;
    }
    const char *p = name + sizeof(prefix) - 1;
    unsigned long long fields[3];
    for (int i = 0; i < 3; i++) {
        char *end;
        if (*p < '0' || *p > '9') {
            return -1;
        }
        errno = 0;
        fields[i] = strtoull(p, &end, 10);
        if (errno != 0 || *end != '-') {
            return -1;
        }
        p = end + 1;
    }
    /* mkdtemp()'s six characters, and nothing more. */
    if (strlen(p) != 6 || strchr(p, '-') != NULL
        || fields[0] == 0 || fields[0] > INT_MAX)
    {
        return -1;
    }
    *pid = (pid_t)fields[0];
    id->start = fields[1];
    id->pidns = fields[2];
    return 0;
}

/* Remove the directory *name* of parent (a stale probe directory) and
 * the files in it, if it is still the directory *seen* (lstat before),
 * without following symbolic links: files are unlinked by name inside
 * the directory opened with O_NOFOLLOW, so a link is removed, never what
 * it points to.  Errors leave things where they are. */
static void
remove_directory_at(int parent, const char *name, const struct stat *seen)
{
    int fd = openat(parent, name,
                    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        return;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_dev != seen->st_dev
        || st.st_ino != seen->st_ino || st.st_uid != geteuid())
    {
        close(fd);
        return;
    }
    DIR *dir = fdopendir(fd);
    if (dir == NULL) {
        close(fd);
        return;
    }
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (strcmp(entry->d_name, ".") != 0
            && strcmp(entry->d_name, "..") != 0)
        {
            /* Only files: the module makes no subdirectories, and a
             * directory here makes the rmdir below fail, keeping it. */
            (void)unlinkat(dirfd(dir), entry->d_name, 0);
        }
    }
    closedir(dir);
    (void)unlinkat(parent, name, AT_REMOVEDIR);
}

/* Remove, from tmp, the probe directories of processes that no longer
 * exist: a process killed by a signal (SIGTERM, as service managers stop
 * services) or ended by os._exit() leaves its directory behind, and a
 * service restarted daily would otherwise add one a day.  Only directories
 * of our user, named by this module for a process of our pid namespace,
 * whose pid is gone or now belongs to a process that started at another
 * time (a reused pid).  A live owner's directory is never touched: its
 * name holds its pid and start time, which no other process has.
 * Called with registry_lock held, once per process image, before it makes
 * its own directory; everything here is best effort. */
static void
remove_stale_directories(const char *tmp, const struct identity *self)
{
    DIR *dir = opendir(tmp);
    if (dir == NULL) {
        return;
    }
    uid_t uid = geteuid();
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        pid_t pid;
        struct identity owner;
        struct stat st;
        if (parse_directory_name(entry->d_name, &pid, &owner) < 0
            || owner.pidns != self->pidns
            || fstatat(dirfd(dir), entry->d_name, &st,
                       AT_SYMLINK_NOFOLLOW) < 0
            || !S_ISDIR(st.st_mode) || st.st_uid != uid)
        {
            continue;
        }
        unsigned long long start;
        if (read_start_time(pid, &start) == 0) {
            if (start == owner.start) {
                continue;               /* the owner runs */
            }
        }
        else if ((errno != ENOENT && errno != ESRCH)
                 || kill(pid, 0) == 0 || errno != ESRCH)
        {
            /* Cannot tell, or the pid runs but /proc hides it (mounted
             * with hidepid, and the process changed its user). */
            continue;
        }
        remove_directory_at(dirfd(dir), entry->d_name, &st);
    }
    closedir(dir);
}

/* Make this process's directory: $TMPDIR (if absolute) or /tmp, then
 * "python-usdt-PID-START-PIDNS-XXXXXX" (the owner's identity), mode 0700;
 * "python-usdt-PID-XXXXXX" where /proc does not give the identity, which
 * no other process then removes.  The first time, remove the directories
 * that dead processes left there. */
static int
make_directory(struct failure *f)
{
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] != '/') {
        tmp = "/tmp";
    }
    pid_t pid = getpid();
    struct identity self;
    int n;
    if (own_identity(&self) == 0) {
        if (!stale_removed) {
            remove_stale_directories(tmp, &self);
            stale_removed = 1;
        }
        n = snprintf(directory, sizeof(directory),
                     "%s/python-usdt-%ld-%llu-%llu-XXXXXX", tmp, (long)pid,
                     self.start, self.pidns);
    }
    else {
        n = snprintf(directory, sizeof(directory),
                     "%s/python-usdt-%ld-XXXXXX", tmp, (long)pid);
    }
    if (n < 0 || (size_t)n >= sizeof(directory)) {
        fail(f, PyExc_OSError, ENAMETOOLONG,
             "usdt: TMPDIR is too long: %s", tmp);
        return -1;
    }
    if (mkdtemp(directory) == NULL) {
        fail(f, PyExc_OSError, errno,
             "usdt: cannot create a directory for the probes' files in "
             "%s: %s", tmp, strerror(errno));
        return -1;
    }
    directory_owner = pid;
    if (!atexit_registered) {
        if (Py_AtExit(remove_files) < 0) {
            /* Too many exit functions: the files would stay behind. */
            (void)rmdir(directory);
            directory_owner = 0;
            fail(f, PyExc_RuntimeError, 0,
                 "usdt: cannot register the removal of its files at exit");
            return -1;
        }
        atexit_registered = 1;
    }
    return 0;
}

static int
write_file(const char *path, const unsigned char *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        return -1;
    }
    while (size > 0) {
        ssize_t n = write(fd, data, size);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            int saved = errno;
            close(fd);
            errno = saved;
            return -1;
        }
        data += n;
        size -= (size_t)n;
    }
    return close(fd);
}

/* Write and load an object for the probes *specs*, and publish a site for
 * each.  Called with registry_lock held. */
static int
load_object(struct elf_probe *specs, int count, struct site **out,
            struct failure *f)
{
    struct site **grown_sites = grow(sites, &site_capacity,
                                     site_count + count);
    if (grown_sites != NULL) {
        sites = grown_sites;
    }
    struct object **grown_objects = grow(objects, &object_capacity,
                                         object_count + 1);
    if (grown_objects != NULL) {
        objects = grown_objects;
    }
    if (grown_sites == NULL || grown_objects == NULL) {
        fail(f, PyExc_MemoryError, 0, "");
        return -1;
    }
    if (directory_owner != getpid() && make_directory(f) < 0) {
        return -1;
    }
    char path[PATH_MAX];
    int n = snprintf(path, sizeof(path), "%s/%lu-%s-%s.so", directory,
                     ++object_serial, specs[0].provider, specs[0].name);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        fail(f, PyExc_OSError, ENAMETOOLONG,
             "usdt: the path of a probe's file is too long (directory %s)",
             directory);
        return -1;
    }
    struct object *object = malloc(sizeof(*object) + (size_t)n + 1);
    struct site *new_sites = calloc(count, sizeof(*new_sites));
    size_t size;
    unsigned char *image = _PyUsdt_BuildObject(specs, count, &size);
    if (object == NULL || new_sites == NULL || image == NULL) {
        fail(f, PyExc_MemoryError, 0, "");
        goto error;
    }
    memcpy(object->path, path, (size_t)n + 1);
    if (write_file(object->path, image, size) < 0) {
        fail(f, PyExc_OSError, errno, "usdt: cannot write %s: %s",
             object->path, strerror(errno));
        (void)unlink(object->path);
        goto error;
    }
    /* Never closed: tracers may hold uprobes on the stubs, and Probe
     * objects in any interpreter refer to them until exit. */
    void *handle = dlopen(object->path, RTLD_NOW | RTLD_LOCAL);
    struct link_map *map = NULL;
    if (handle == NULL || dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0) {
        const char *why = dlerror();
        fail(f, PyExc_OSError, 0,
             "usdt: cannot load %s: %s (a directory mounted noexec? set "
             "TMPDIR to another one)", object->path, why ? why : "?");
        (void)unlink(object->path);
        goto error;
    }
    object->owner = getpid();
    objects[object_count++] = object;
    for (int i = 0; i < count; i++) {
        struct site *site = &new_sites[i];
        strcpy(site->provider, specs[i].provider);
        strcpy(site->name, specs[i].name);
        strcpy(site->types, specs[i].types);
        site->ntypes = (Py_ssize_t)strlen(site->types);
        site->object = object;
        site->semaphore = (uint16_t *)(map->l_addr + specs[i].semaphore);
        site->stub = (stub_func)(map->l_addr + specs[i].stub);
        sites[site_count++] = site;
        out[i] = site;
    }
    free(image);
    return 0;

error:
    free(object);
    free(new_sites);
    free(image);
    return -1;
}

/* The sites for probes (provider, names[i]) with types[i]: existing ones if
 * their types match (ValueError if not), new ones for the others, created
 * together in one object. */
int
_PyUsdt_GetSites(const char *provider, const char *const *names,
                 const char *const *types, int count, struct site **out)
{
    struct failure f = {NULL};
    struct elf_probe specs[2];
    int missing[2];
    int nmissing = 0;
    assert(count <= 2);

    pthread_mutex_lock(&registry_lock);
    if (!atfork_registered) {
        if (pthread_atfork(NULL, NULL, registry_atfork_child) != 0) {
            pthread_mutex_unlock(&registry_lock);
            PyErr_NoMemory();
            return -1;
        }
        atfork_registered = 1;
    }
    for (int i = 0; i < count; i++) {
        struct site *site = find_site(provider, names[i]);
        if (site == NULL) {
            specs[nmissing].provider = provider;
            specs[nmissing].name = names[i];
            specs[nmissing].types = types[i];
            missing[nmissing++] = i;
        }
        else if (strcmp(site->types, types[i]) != 0) {
            fail(&f, PyExc_ValueError, 0,
                 "probe %s:%s already exists in this process with other "
                 "argument types", provider, names[i]);
            break;
        }
        else {
            out[i] = site;
        }
    }
    if (f.type == NULL && nmissing > 0) {
        struct site *created[2];
        if (load_object(specs, nmissing, created, &f) == 0) {
            for (int j = 0; j < nmissing; j++) {
                out[missing[j]] = created[j];
            }
        }
    }
    pthread_mutex_unlock(&registry_lock);
    if (f.type != NULL) {
        raise_failure(&f);
        return -1;
    }
    return 0;
}
