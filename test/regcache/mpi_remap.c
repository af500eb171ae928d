/*
 * mpi_remap: an Open MPI user's path (pml ucx) over the ib_regcache
 * component, or over stock UCX for comparison. Two ranks:
 *
 *   mpirun -np 2 --mca pml ucx ... kreg-run --tls rc_kreg,ud_kreg \
 *       mpi_remap [--rounds N] [--fresh]
 *   mpirun -np 2 --mca pml ucx -x LD_PRELOAD=libucm_kernel.so -x UCX_TLS=rc_verbs,ud_verbs \
 *       mpi_remap [--rounds N] --sync
 *
 * 1. data: rank 0 sends tagged messages of 1 B, 64 KiB (eager), 1 MiB and
 *    8 MiB (rendezvous), twice each from the same buffer with new bytes the
 *    second time; rank 1 checks the length and every byte.
 * 2. remap rounds: rank 0 maps a 1 MiB buffer through libc (which UCX's and
 *    Open MPI's hooks see), sends it, then unmaps it and maps fresh memory
 *    with a new pattern at the same address by raw syscall(SYS_munmap) and
 *    syscall(SYS_mmap) (which no hook sees), and sends it again; rank 1
 *    counts the rounds whose second message carried the old bytes (stale).
 *
 * Rank 1 prints "data: ..." and
 *    <kernel|sync|hooks>: mpi remap 1 MiB: stale: S of N rounds (C corrupt, ...)
 * ("kernel" when the component is loaded: kreg_ib_regcache_status() == 0;
 * "sync" when both ranks run the module's synchronous delivery:
 * kreg_sync_active()).
 * Exit status: 0 if every byte of the data messages was right, every round
 * ran and, with --fresh, the component is loaded and no round was stale or
 * corrupt (with --sync: synchronous delivery runs in both ranks and no
 * round was); 1 otherwise (every rank exits with the same status).
 *
 * --threads T (instead of 1 and 2; issue 32): MPI_Init_thread with
 * MPI_THREAD_MULTIPLE (exit 1 if not provided), T threads per rank, thread
 * i of rank 0 sending to thread i of rank 1 under its own tag, --rounds N
 * messages each. Every message is a buffer allocated fresh: its size
 * changes every round (64 KiB + 64 B, 1 MiB, 64 KiB + 64 B, 3 MiB in turn:
 * eager, then rendezvous, registered through UCX's cache) and its kind
 * every fourth (raw syscall mmap and munmap, which no hook sees; libc mmap
 * and munmap; malloc and free); it is filled with words naming (thread,
 * round), sent and freed. The threads run at once, so they map each
 * other's freed addresses. Rank 1
 * checks every word: a message with words of an earlier message (another
 * round or thread: old pages the cache still had registered) is stale, any
 * other wrong message (or length) corrupt. Rank 1 prints
 *    <kernel|sync|async|hooks>: mpi threads T=4: stale: S of N messages (C corrupt)
 * Exit status: with --sync, 0 only if synchronous delivery runs in both
 * ranks and no message was stale or corrupt (--fresh: likewise with the
 * component); else 0 (the counts are what it shows).
 * --kreg-start (the control of --sync; libucm_kernel preloaded with
 * UCX_KREG_SYNC=n): kreg_start() before MPI_Init, so the library runs
 * without synchronous delivery (UCM's hooks off for unmaps); exit 1 if it
 * does not start that way. Label "async".
 */
#define _GNU_SOURCE
#include "test_buffers.h"

#include <mpi.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define REMAP_LEN   (1u << 20)
#define TAG_DATA    100
#define TAG_FIRST   1000
#define TAG_FLAG    2000
#define TAG_SECOND  3000
#define TAG_THREADS 5000

/* "kernel" if the ib_regcache component is loaded and running: preloaded
 * (UCX 1.13), or loaded by UCX 1.22 from UCX_PLUGIN_PATH, where it is
 * local to its handle (found by its soname) */
static int component_loaded(void);

/* --sync: libucm_kernel preloaded and serving the process with the
 * module's synchronous delivery (stock transports, UCX's own cache) */
static int sync_delivery_active(void)
{
    int (*active)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "kreg_sync_active");

    return (active != NULL) && active();
}

static int component_loaded(void)
{
    void *lib = dlopen("libuct_ib_regcache.so.0", RTLD_LAZY | RTLD_NOLOAD);
    int (*status)(void) = (int (*)(void))dlsym(lib ? lib : RTLD_DEFAULT,
                                                "kreg_ib_regcache_status");
    return (status != NULL) && (status() == 0);
}

/* --threads: a message's words name it, so a stale one says whose it is */
#define THR_MAX_LEN  (3u << 20)
#define THR_REPORTS  10 /* messages described per rank */
static const size_t thr_sizes[] = {(64u << 10) + 64, 1u << 20, 3u << 20};
/* a thread's sizes in turn: the small one twice (the bytes of 1000
 * messages are what a TCG guest's Soft-RoCE takes its time over) */
static const int thr_size_turn[] = {0, 1, 0, 2};
enum { THR_RAW, THR_LIBC, THR_MALLOC, THR_KINDS };
static const char *const thr_kind_names[] = {"raw mmap/munmap", "libc mmap/munmap",
                                             "malloc/free"};

struct thr_arg {
    pthread_t          tid;
    pthread_barrier_t *start;
    int                rank, index, nthreads, rounds;
    int                stale, corrupt; /* rank 1 */
};

static int thr_reports; /* atomic: messages described so far */

static size_t thr_len(int thread, int round)
{
    return thr_sizes[thr_size_turn[(round + thread) % 4]];
}

static int thr_kind(int thread, int round)
{
    return (round / 4 + thread) % THR_KINDS;
}

static uint32_t thr_id(int thread, int round)
{
    return ((uint32_t)thread << 20) + (uint32_t)round + 1;
}

static uint32_t thr_mix(uint32_t id)
{
    return id * 0x85ebca6bu;
}

/* word j of message id: the id, and j (mixed with it) */
static uint64_t thr_word(uint32_t id, size_t j)
{
    return ((uint64_t)id << 32) | (uint32_t)((uint32_t)j ^ thr_mix(id));
}

/* 1 if w is a word of a message of this run other than id: *thread_p,
 * *round_p, *index_p say which and where */
static int thr_foreign_word(uint64_t w, uint32_t id, int nthreads, int rounds,
                            int *thread_p, int *round_p, size_t *index_p)
{
    uint32_t wid = (uint32_t)(w >> 32), j;
    int thread, round;

    if ((wid == 0) || (wid == id)) {
        return 0;
    }
    thread = (int)((wid - 1) >> 20);
    round  = (int)((wid - 1) & 0xfffff);
    if ((thread >= nthreads) || (round >= rounds)) {
        return 0;
    }
    j = (uint32_t)w ^ thr_mix(wid);
    if (j >= thr_len(thread, round) / 8) {
        return 0;
    }
    *thread_p = thread;
    *round_p  = round;
    *index_p  = j;
    return 1;
}

static void *thr_alloc(int kind, size_t len)
{
    long r;
    void *p;

    switch (kind) {
    case THR_RAW:
        r = syscall(SYS_mmap, NULL, len, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0L);
        return ((r < 0) && (r > -4096)) ? NULL : (void*)r;
    case THR_LIBC:
        p = libc_mmap(len);
        return (p == MAP_FAILED) ? NULL : p;
    default:
        return malloc(len);
    }
}

static void thr_free(int kind, void *buf, size_t len)
{
    switch (kind) {
    case THR_RAW:
        raw_munmap(buf, len);
        break;
    case THR_LIBC:
        munmap(buf, len);
        break;
    default:
        free(buf);
        break;
    }
}

/* rank 1: checks message (thread, round) in rbuf (count bytes arrived);
 * 0 right, 1 stale, 2 corrupt */
static int thr_check(const struct thr_arg *a, int round, const uint64_t *rbuf,
                     int count)
{
    const size_t len = thr_len(a->index, round), words = len / 8;
    const uint32_t id = thr_id(a->index, round);
    size_t j, first = words, wrong = 0, foreign = 0, f_index = 0, f_at = 0;
    int f_thread = -1, f_round = -1, verdict;

    if (count != (int)len) {
        if (__atomic_fetch_add(&thr_reports, 1, __ATOMIC_RELAXED) < THR_REPORTS) {
            printf("corrupt: thread %d round %d (%s, %zu B): %d bytes arrived\n",
                   a->index, round, thr_kind_names[thr_kind(a->index, round)], len,
                   count);
        }
        return 2;
    }
    for (j = 0; j < words; ++j) {
        int t, r;
        size_t at;

        if (rbuf[j] == thr_word(id, j)) {
            continue;
        }
        if (first == words) {
            first = j;
        }
        ++wrong;
        if (thr_foreign_word(rbuf[j], id, a->nthreads, a->rounds, &t, &r, &at)) {
            if (foreign++ == 0) {
                f_thread = t;
                f_round  = r;
                f_index  = at;
                f_at     = j;
            }
        }
    }
    if (wrong == 0) {
        return 0;
    }
    verdict = foreign ? 1 : 2;
    if (__atomic_fetch_add(&thr_reports, 1, __ATOMIC_RELAXED) < THR_REPORTS) {
        printf("%s: thread %d round %d (%s, %zu B): %zu of %zu words wrong from "
               "byte %zu, %zu of them an earlier message's", verdict == 1 ?
               "stale" : "corrupt", a->index, round,
               thr_kind_names[thr_kind(a->index, round)], len, wrong, words,
               first * 8, foreign);
        if (foreign) {
            printf(" (byte %zu: thread %d round %d, %s, its byte %zu)", f_at * 8,
                   f_thread, f_round, thr_kind_names[thr_kind(f_thread, f_round)],
                   f_index * 8);
        }
        printf("\n");
    }
    return verdict;
}

static void *thr_main(void *p)
{
    struct thr_arg *a = (struct thr_arg*)p;
    const int tag = TAG_THREADS + a->index;
    uint64_t *rbuf = NULL;
    int n;

    if (a->rank == 1) {
        rbuf = (uint64_t*)libc_mmap(THR_MAX_LEN); /* never freed until the end */
        if (rbuf == MAP_FAILED) {
            perror("mmap");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    pthread_barrier_wait(a->start);
    for (n = 0; n < a->rounds; ++n) {
        const size_t len = thr_len(a->index, n);
        const uint32_t id = thr_id(a->index, n);

        if (a->rank == 0) {
            const int kind = thr_kind(a->index, n);
            uint64_t *buf = (uint64_t*)thr_alloc(kind, len);
            size_t j;

            if (buf == NULL) {
                fprintf(stderr, "mpi_remap: thread %d: %s of %zu B failed\n",
                        a->index, thr_kind_names[kind], len);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            for (j = 0; j < len / 8; ++j) {
                buf[j] = thr_word(id, j);
            }
            MPI_Send(buf, (int)len, MPI_BYTE, 1, tag, MPI_COMM_WORLD);
            thr_free(kind, buf, len);
        } else {
            MPI_Status st;
            int count = -1, v;

            memset(rbuf, 0, len);
            MPI_Recv(rbuf, THR_MAX_LEN, MPI_BYTE, 0, tag, MPI_COMM_WORLD, &st);
            MPI_Get_count(&st, MPI_BYTE, &count);
            v = thr_check(a, n, rbuf, count);
            a->stale   += (v == 1);
            a->corrupt += (v == 2);
        }
    }
    if (rbuf != NULL) {
        munmap(rbuf, THR_MAX_LEN);
    }
    return NULL;
}

/* --threads: res[0] stale, res[1] corrupt (rank 1's); *seconds: the run */
static void thread_rounds(int rank, int nthreads, int rounds, int res[2],
                          double *seconds)
{
    struct thr_arg *args = calloc((size_t)nthreads, sizeof(*args));
    pthread_barrier_t start;
    double t0;
    int i;

    if (args == NULL) {
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    pthread_barrier_init(&start, NULL, (unsigned)nthreads);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (i = 0; i < nthreads; ++i) {
        args[i].start    = &start;
        args[i].rank     = rank;
        args[i].index    = i;
        args[i].nthreads = nthreads;
        args[i].rounds   = rounds;
        if (pthread_create(&args[i].tid, NULL, thr_main, &args[i]) != 0) {
            fprintf(stderr, "mpi_remap: pthread_create failed\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    res[0] = res[1] = 0;
    for (i = 0; i < nthreads; ++i) {
        pthread_join(args[i].tid, NULL);
        res[0] += args[i].stale;
        res[1] += args[i].corrupt;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    *seconds = MPI_Wtime() - t0;
    pthread_barrier_destroy(&start);
    free(args);
}

/* --kreg-start: libucm_kernel's kreg_start() (found by name: preloaded), and
 * the library must then run without synchronous delivery (UCX_KREG_SYNC=n) */
static int control_start(void)
{
    int (*start)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "kreg_start");

    if (start == NULL) {
        return 0;
    }
    return (start() == 0) && !sync_delivery_active();
}

static void control_stop(void)
{
    void (*stop)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "kreg_stop");

    if (stop != NULL) {
        stop();
    }
}

/* --threads: the run and rank 1's summary; the exit status */
static int threads_main(int rank, int nthreads, int rounds, int fresh, int sync,
                        int control)
{
    const int total = nthreads * rounds;
    int res[2], mine, synced, ok = 1;
    double seconds = 0;

    thread_rounds(rank, nthreads, rounds, res, &seconds);
    MPI_Bcast(res, 2, MPI_INT, 1, MPI_COMM_WORLD);
    mine = sync_delivery_active();
    MPI_Allreduce(&mine, &synced, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 1) {
        int loaded = component_loaded();

        printf("info: mpi threads T=%d, %d messages each (%zu B, 1 MiB, %zu B, 3 "
               "MiB in turn; raw mmap/munmap, libc mmap/munmap, malloc/free): %.1f "
               "s, %.1f messages/s\n", nthreads, rounds, thr_sizes[0], thr_sizes[0],
               seconds,
               seconds > 0 ? total / seconds : 0.0);
        printf("%s: mpi threads T=%d: stale: %d of %d messages (%d corrupt)\n",
               loaded ? "kernel" : synced ? "sync" : control ? "async" : "hooks",
               nthreads, res[0], total, res[1]);
        if (fresh && !loaded) {
            printf("error: --fresh but the ib_regcache component is not loaded\n");
        }
        if (sync && !synced) {
            printf("error: --sync but synchronous delivery does not run in both "
                   "ranks\n");
        }
        ok = !fresh || (loaded && (res[0] == 0) && (res[1] == 0));
        ok = ok && (!sync || (synced && (res[0] == 0) && (res[1] == 0)));
        fflush(stdout);
    }
    MPI_Bcast(&ok, 1, MPI_INT, 1, MPI_COMM_WORLD);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    static const size_t sizes[] = {1, 64 << 10, 1 << 20, 8 << 20};
    enum { NSIZES = sizeof(sizes) / sizeof(sizes[0]) };
    int rounds = 20, fresh = 0, sync = 0, mine, synced, rank, nranks, i, k;
    int nthreads = 0, control = 0, started = 1, all_started, usage = 0;
    int provided = MPI_THREAD_SINGLE;
    /* rank 1's results: data errors, stale, corrupt, rounds not remapped */
    int res[4] = {0, 0, 0, 0};
    int ok;

    /* the options first: --threads and --kreg-start act before MPI_Init */
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--rounds") && (i + 1 < argc)) {
            rounds = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--fresh")) {
            fresh = 1;
        } else if (!strcmp(argv[i], "--sync")) {
            sync = 1;
        } else if (!strcmp(argv[i], "--threads") && (i + 1 < argc)) {
            nthreads = atoi(argv[++i]);
            usage    = usage || (nthreads < 1) || (nthreads > 256);
        } else if (!strcmp(argv[i], "--kreg-start")) {
            control = 1;
        } else {
            usage = 1;
        }
    }
    usage = usage || (nthreads && (rounds < 1 || rounds > 0xfffff));
    if (control && !usage) {
        started = control_start();
    }
    if (nthreads && !usage) {
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    } else {
        MPI_Init(&argc, &argv);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (usage) {
        if (rank == 0) {
            fprintf(stderr, "usage: mpi_remap [--rounds N] [--fresh] [--sync]\n"
                            "       mpi_remap --threads T [--rounds N] [--fresh] "
                            "[--sync] [--kreg-start]\n");
        }
        MPI_Finalize();
        return 2;
    }
    if (nranks != 2) {
        if (rank == 0) {
            fprintf(stderr, "mpi_remap: needs exactly 2 ranks, not %d\n", nranks);
        }
        MPI_Finalize();
        return 2;
    }
    if (nthreads && (provided < MPI_THREAD_MULTIPLE)) {
        if (rank == 0) {
            printf("error: --threads: MPI_Init_thread provided thread level %d, "
                   "not MPI_THREAD_MULTIPLE (%d)\n", provided, MPI_THREAD_MULTIPLE);
            fflush(stdout);
        }
        MPI_Finalize();
        return 1;
    }
    MPI_Allreduce(&started, &all_started, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_started) {
        if (!started) {
            printf("error: rank %d: --kreg-start: kreg_start() must run without "
                   "synchronous delivery (preload libucm_kernel.so, "
                   "UCX_KREG_SYNC=n)\n", rank);
            fflush(stdout);
        }
        MPI_Finalize();
        if (control) {
            control_stop();
        }
        return 1;
    }
    if (nthreads) {
        ok = (threads_main(rank, nthreads, rounds, fresh, sync, control) == 0);
        MPI_Finalize();
        if (control) {
            control_stop();
        }
        return ok ? 0 : 1;
    }

    /* 1. data */
    for (k = 0; k < NSIZES; ++k) {
        size_t len = sizes[k];
        uint8_t *buf = libc_mmap(len);
        int rep;

        if (buf == MAP_FAILED) {
            perror("mmap");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (rep = 0; rep < 2; ++rep) {
            uint32_t seed = 7 + 2 * k + rep;
            if (rank == 0) {
                pattern_fill(buf, len, seed);
                MPI_Send(buf, (int)len, MPI_BYTE, 1, TAG_DATA + k, MPI_COMM_WORLD);
            } else {
                MPI_Status st;
                int count = -1;
                size_t bad;

                memset(buf, 0, len);
                MPI_Recv(buf, (int)len, MPI_BYTE, 0, TAG_DATA + k, MPI_COMM_WORLD,
                         &st);
                MPI_Get_count(&st, MPI_BYTE, &count);
                bad = pattern_first_bad(buf, len, seed);
                if ((count != (int)len) || (bad != len)) {
                    printf("error: data %zu B send %d: %d bytes received, byte "
                           "%zu wrong\n", len, rep + 1, count, bad);
                    ++res[0];
                }
            }
        }
        munmap(buf, len);
    }

    /* 2. remap rounds, with a buffer at one address per round */
    if (rank == 0) {
        for (i = 0; i < rounds; ++i) {
            uint32_t old_seed = 1000 + 2 * i, new_seed = old_seed + 1;
            void *buf = libc_mmap(REMAP_LEN);
            int remapped;

            if (buf == MAP_FAILED) {
                perror("mmap");
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            pattern_fill(buf, REMAP_LEN, old_seed);
            MPI_Send(buf, REMAP_LEN, MPI_BYTE, 1, TAG_FIRST + i, MPI_COMM_WORLD);
            remapped = raw_remap(buf, REMAP_LEN);
            if (!remapped) {
                buf = libc_mmap(REMAP_LEN); /* not a round: new bytes elsewhere */
                if (buf == MAP_FAILED) {
                    perror("mmap");
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
            }
            pattern_fill(buf, REMAP_LEN, new_seed);
            MPI_Send(&remapped, 1, MPI_INT, 1, TAG_FLAG + i, MPI_COMM_WORLD);
            MPI_Send(buf, REMAP_LEN, MPI_BYTE, 1, TAG_SECOND + i, MPI_COMM_WORLD);
            munmap(buf, REMAP_LEN);
        }
    } else {
        uint8_t *rbuf = libc_mmap(REMAP_LEN); /* one receive buffer: never reused */

        if (rbuf == MAP_FAILED) {
            perror("mmap");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (i = 0; i < rounds; ++i) {
            uint32_t old_seed = 1000 + 2 * i, new_seed = old_seed + 1;
            int remapped = 0;
            size_t bad;

            memset(rbuf, 0, REMAP_LEN);
            MPI_Recv(rbuf, REMAP_LEN, MPI_BYTE, 0, TAG_FIRST + i, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            bad = pattern_first_bad(rbuf, REMAP_LEN, old_seed);
            if (bad != REMAP_LEN) {
                printf("error: round %d: the first send (before the remap) has "
                       "byte %zu wrong\n", i, bad);
                ++res[0];
            }
            MPI_Recv(&remapped, 1, MPI_INT, 0, TAG_FLAG + i, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            memset(rbuf, 0, REMAP_LEN);
            MPI_Recv(rbuf, REMAP_LEN, MPI_BYTE, 0, TAG_SECOND + i, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            if (pattern_first_bad(rbuf, REMAP_LEN, new_seed) == REMAP_LEN) {
                /* current */
            } else if (remapped &&
                       (pattern_first_bad(rbuf, REMAP_LEN, old_seed) == REMAP_LEN)) {
                ++res[1];
            } else {
                ++res[2];
            }
            res[3] += !remapped;
        }
        munmap(rbuf, REMAP_LEN);
    }

    MPI_Bcast(res, 4, MPI_INT, 1, MPI_COMM_WORLD);
    /* both ranks: rank 0 remaps, rank 1 prints */
    mine = sync_delivery_active();
    MPI_Allreduce(&mine, &synced, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    ok = (res[0] == 0) && (res[3] <= rounds / 2) && (!fresh || (res[2] == 0));
    if (rank == 1) {
        int loaded = component_loaded();

        printf("data: 1 B, 64 KiB, 1 MiB, 8 MiB, two sends each: %s\n",
               res[0] ? "WRONG BYTES" : "every byte right");
        printf("%s: mpi remap 1 MiB: stale: %d of %d rounds (%d corrupt, %d not "
               "remapped at the same address)\n",
               loaded ? "kernel" : synced ? "sync" : control ? "async" : "hooks",
               res[1], rounds - res[3], res[2], res[3]);
        if (fresh && !loaded) {
            printf("error: --fresh but the ib_regcache component is not loaded\n");
        }
        if (sync && !synced) {
            printf("error: --sync but synchronous delivery does not run here\n");
        }
        ok = ok && (!fresh || (loaded && (res[1] == 0)));
        ok = ok && (!sync || (synced && (res[1] == 0) && (res[2] == 0)));
        fflush(stdout);
    }
    MPI_Bcast(&ok, 1, MPI_INT, 1, MPI_COMM_WORLD);
    MPI_Finalize();
    if (control) {
        control_stop();
    }
    return ok ? 0 : 1;
}
