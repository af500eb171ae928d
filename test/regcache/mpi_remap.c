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
 */
#define _GNU_SOURCE
#include "test_buffers.h"

#include <mpi.h>

#include <dlfcn.h>
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

int main(int argc, char **argv)
{
    static const size_t sizes[] = {1, 64 << 10, 1 << 20, 8 << 20};
    enum { NSIZES = sizeof(sizes) / sizeof(sizes[0]) };
    int rounds = 20, fresh = 0, sync = 0, mine, synced, rank, nranks, i, k;
    /* rank 1's results: data errors, stale, corrupt, rounds not remapped */
    int res[4] = {0, 0, 0, 0};
    int ok;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--rounds") && (i + 1 < argc)) {
            rounds = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--fresh")) {
            fresh = 1;
        } else if (!strcmp(argv[i], "--sync")) {
            sync = 1;
        } else {
            if (rank == 0) {
                fprintf(stderr, "usage: mpi_remap [--rounds N] [--fresh] [--sync]\n");
            }
            MPI_Finalize();
            return 2;
        }
    }
    if (nranks != 2) {
        if (rank == 0) {
            fprintf(stderr, "mpi_remap: needs exactly 2 ranks, not %d\n", nranks);
        }
        MPI_Finalize();
        return 2;
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
               loaded ? "kernel" : synced ? "sync" : "hooks",
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
    return ok ? 0 : 1;
}
