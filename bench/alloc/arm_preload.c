/* LD_PRELOAD helper of bench/alloc_armed.py: before the interpreter starts,
 * add one to each semaphore whose link-time address is listed (hex,
 * comma-separated) in USDT_ARM_SEMAPHORES, as the kernel does when a
 * tracer's uprobe goes on the probe.  The probes then fire into their nops:
 * what the interpreter itself costs while armed, without the traps, and
 * measurable under valgrind, where uprobes do not work.  Only in the
 * program named by USDT_ARM_EXE: LD_PRELOAD reaches setarch and valgrind's
 * launcher too. */

#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int
main_bias(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    /* The first object is the executable. */
    *(uintptr_t *)data = (uintptr_t)info->dlpi_addr;
    return 1;
}

__attribute__((constructor)) static void
arm(void)
{
    const char *list = getenv("USDT_ARM_SEMAPHORES");
    const char *exe = getenv("USDT_ARM_EXE");
    if (list == NULL || *list == '\0' || exe == NULL) {
        return;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n < 0) {
        return;
    }
    self[n] = '\0';
    if (strcmp(self, exe) != 0) {
        return;
    }
    uintptr_t bias = 0;
    dl_iterate_phdr(main_bias, &bias);
    char *end;
    for (const char *p = list; *p != '\0'; p = end) {
        unsigned long address = strtoul(p, &end, 16);
        if (end == p) {
            break;
        }
        *(volatile unsigned short *)(bias + address) += 1;
        if (*end == ',') {
            end++;
        }
    }
}
