/* Reads the wall clock every way a C program can: libc's time(), gettimeofday() and
 * clock_gettime(CLOCK_REALTIME / _COARSE / CLOCK_TAI), and the vDSO's __vdso_clock_gettime
 * called directly (found through the auxiliary vector, the way Go's runtime does), then
 * checks that CLOCK_MONOTONIC still advances. Prints one line per read: NAME SECONDS.NANOS
 * (or NAME error ERRNO). Used by tests/suite/determinism/environment.rs. */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/time.h>
#include <time.h>

typedef int (*clock_fn)(clockid_t, struct timespec *);

static clock_fn vdso_lookup(const char *want) {
    const unsigned char *base = (const unsigned char *)getauxval(AT_SYSINFO_EHDR);
    if (!base) return 0;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)base;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(base + eh->e_shoff);
    const Elf64_Phdr *ph = (const Elf64_Phdr *)(base + eh->e_phoff);
    uintptr_t vbase = 0;
    for (int i = 0; i < eh->e_phnum; i++)
        if (ph[i].p_type == PT_LOAD) { vbase = ph[i].p_vaddr; break; }
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_DYNSYM) continue;
        const Elf64_Sym *sym = (const Elf64_Sym *)(base + sh[i].sh_offset);
        const char *str = (const char *)(base + sh[sh[i].sh_link].sh_offset);
        for (size_t j = 0; j < sh[i].sh_size / sizeof(Elf64_Sym); j++)
            if (sym[j].st_shndx && strcmp(str + sym[j].st_name, want) == 0)
                return (clock_fn)(base + sym[j].st_value - vbase);
    }
    return 0;
}

static void show(const char *name, int r, const struct timespec *ts) {
    if (r != 0) printf("%s error %d\n", name, errno);
    else printf("%s %lld.%09ld\n", name, (long long)ts->tv_sec, ts->tv_nsec);
}

int main(void) {
    struct timespec ts;
    time_t t = time(0);
    printf("time %lld.000000000\n", (long long)t);
    struct timeval tv;
    if (gettimeofday(&tv, 0) == 0) printf("gettimeofday %lld.%06ld000\n", (long long)tv.tv_sec, (long)tv.tv_usec);
    else printf("gettimeofday error %d\n", errno);
    show("clock_gettime", clock_gettime(CLOCK_REALTIME, &ts), &ts);
    show("clock_gettime_coarse", clock_gettime(CLOCK_REALTIME_COARSE, &ts), &ts);
    clock_fn direct = vdso_lookup("__vdso_clock_gettime");
    if (direct) show("vdso_direct", direct(CLOCK_REALTIME, &ts), &ts);
    else printf("vdso_direct missing\n");
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (volatile long i = 0; i < 2000000; i++) {}
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("monotonic_advances %d\n", b.tv_sec > a.tv_sec || (b.tv_sec == a.tv_sec && b.tv_nsec > a.tv_nsec));
    return 0;
}
