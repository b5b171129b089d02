/* The guest's C program for tools/uprobe-guest-7.3: hit() is a marker
 * site, the pair of the interpreter's markers (a 1-byte nop, then the
 * 10-byte nop that Linux 7.3 optimizes), and a uprobe goes on either nop.
 *
 *   site count N     calls hit() N times
 *   site fork N      calls hit() N times, then forks a child that calls it
 *                    N times; prints both processes' view of the site
 *   site redzone N   calls redzone() N times, which keeps data in the red
 *                    zone across a site of its own; prints how many calls
 *                    found it changed
 *   site time N      prints the nanoseconds of one call of hit(), over N
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAIR "nop; .byte 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0\n"

__attribute__((noinline)) void
hit(void)
{
    __asm__ volatile(PAIR);
}

/* A leaf function (no call, so the compiler may keep data below %rsp)
 * with data at the red zone's two ends, -8(%rsp) and -128(%rsp), across
 * its site: returns 0 if both survived. */
int redzone(void);
__asm__(
    ".text\n"
    ".globl redzone\n"
    ".type redzone, @function\n"
    "redzone:\n"
    "    movabsq $0x5a5aa5a55a5aa5a5, %rax\n"
    "    movq %rax, -8(%rsp)\n"
    "    movq %rax, -128(%rsp)\n"
    ".globl redzone_site\n"
    "redzone_site:\n"
    "    " PAIR
    "    xorl %edx, %edx\n"
    "    cmpq %rax, -8(%rsp)\n"
    "    setne %dl\n"
    "    xorl %ecx, %ecx\n"
    "    cmpq %rax, -128(%rsp)\n"
    "    setne %cl\n"
    "    leal (%rdx,%rcx), %eax\n"
    "    ret\n"
    ".size redzone, . - redzone\n");

static void
show(const char *who)
{
    char line[512];
    int mapped = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        mapped |= strstr(line, "[uprobes-trampoline]") != NULL;
    }
    if (f != NULL) {
        fclose(f);
    }
    const unsigned char *p = (const unsigned char *)hit;
    printf("%s: site", who);
    for (int i = 0; i < 11; i++) {
        printf(" %02x", p[i]);
    }
    printf(", [uprobes-trampoline] %s\n", mapped ? "mapped" : "absent");
    fflush(stdout);
}

int
main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: site count|fork|redzone|time N\n");
        return 2;
    }
    long n = atol(argv[2]);
    if (strcmp(argv[1], "count") == 0) {
        for (long i = 0; i < n; i++) {
            hit();
        }
    }
    else if (strcmp(argv[1], "fork") == 0) {
        for (long i = 0; i < n; i++) {
            hit();
        }
        show("parent");
        pid_t pid = fork();
        if (pid == 0) {
            show("child ");
            for (long i = 0; i < n; i++) {
                hit();
            }
            show("child ");
            _exit(0);
        }
        int status;
        waitpid(pid, &status, 0);
        if (WIFSIGNALED(status)) {
            printf("child killed by signal %d\n", WTERMSIG(status));
            return 1;
        }
        printf("child exited %d\n", WEXITSTATUS(status));
    }
    else if (strcmp(argv[1], "redzone") == 0) {
        long changed = 0;
        for (long i = 0; i < n; i++) {
            changed += redzone() != 0;
        }
        printf("red zone changed in %ld of %ld calls\n", changed, n);
        return changed != 0;
    }
    else if (strcmp(argv[1], "time") == 0) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long i = 0; i < n; i++) {
            hit();
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
        printf("%.0f ns per call over %ld calls\n", ns / n, n);
    }
    else {
        fprintf(stderr, "site: unknown mode %s\n", argv[1]);
        return 2;
    }
    return 0;
}
