/* A busy node for kreg_bench --busy: the measured process is an MPI rank
 * bound to one CPU (which it keeps busy itself), and every other CPU it may
 * use runs another rank, a process that busy-polls there without ever
 * sleeping (as an MPI progress loop polls its completion queue).
 *
 * The pollers must never outlive the benchmark: each one is killed with
 * SIGKILL by the kernel when the parent dies (PR_SET_PDEATHSIG, also on a
 * crash or SIGKILL of the parent), by the parent when a phase ends, at
 * exit() (a failing check, die()) and on SIGINT, SIGTERM, SIGHUP, SIGQUIT. */
#ifndef UCX_KREG_BENCH_BUSY_LOAD_H
#define UCX_KREG_BENCH_BUSY_LOAD_H

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sched.h>
#include <string>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace bench {

class busy_load {
public:
    /* Binds this process (and so every child it starts from now on) to
     * the first CPU it may use; the others get a poller each in start().
     * false if the affinity cannot be read or set. */
    bool bind_rank()
    {
        cpu_set_t set;
        CPU_ZERO(&set);
        if (sched_getaffinity(0, sizeof(set), &set) != 0) {
            return false;
        }
        rank_cpu_ = -1;
        others_.clear();
        for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
            if (!CPU_ISSET(cpu, &set)) {
                continue;
            }
            if (rank_cpu_ < 0) {
                rank_cpu_ = cpu;
            } else {
                others_.push_back(cpu);
            }
        }
        if (rank_cpu_ < 0) {
            return false;
        }
        CPU_ZERO(&set);
        CPU_SET(rank_cpu_, &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0) {
            return false;
        }
        install_handlers();
        return true;
    }

    /* What the load is, for the first line of the output. */
    std::string describe() const
    {
        std::string s = "the measured process bound to CPU " + std::to_string(rank_cpu_) +
                        " (a rank polling there itself), ";
        if (others_.empty()) {
            return s + "no other CPU to load (1 CPU)";
        }
        s += std::to_string(others_.size()) + " busy-polling process" +
             (others_.size() > 1 ? "es" : "") + " bound to CPU";
        for (size_t i = 0; i < others_.size(); ++i) {
            s += (i ? "," : " ") + std::to_string(others_[i]);
        }
        return s;
    }

    /* Starts a poller on each other CPU; each one spins before this
     * returns. false (and none left running) if one could not start. */
    bool start()
    {
        stop();
        const pid_t parent = getpid();
        for (int cpu : others_) {
            int ready[2];
            if (pipe(ready) != 0) {
                stop();
                return false;
            }
            const pid_t pid = fork();
            if (pid < 0) {
                close(ready[0]);
                close(ready[1]);
                stop();
                return false;
            }
            if (pid == 0) {
                close(ready[0]);
                poll_forever(parent, cpu, ready[1]);
            }
            close(ready[1]);
            pids()[count()++] = pid;
            char c;
            const bool up = read(ready[0], &c, 1) == 1;
            close(ready[0]);
            if (!up) {
                stop();
                return false;
            }
        }
        return true;
    }

    /* CPU seconds the running pollers have used so far (utime + stime
     * from /proc): whether they really ran while the load was on. */
    static double cpu_seconds()
    {
        double sum = 0;
        const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
        for (int i = 0; i < count(); ++i) {
            char path[64], buf[1024];
            snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pids()[i]));
            FILE *f = fopen(path, "r");
            if (f == nullptr) {
                continue;
            }
            const size_t n = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
            buf[n] = '\0';
            const char *p = strrchr(buf, ')'); /* the name may hold spaces */
            unsigned long ut = 0, st = 0;
            if ((p != nullptr) &&
                (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                        &ut, &st) == 2)) {
                sum += static_cast<double>(ut + st) / tick;
            }
        }
        return sum;
    }

    /* Kills and reaps every poller. */
    static void stop()
    {
        kill_all();
        for (int i = 0; i < count(); ++i) {
            while ((waitpid(pids()[i], nullptr, 0) < 0) && (errno == EINTR)) {
            }
        }
        count() = 0;
    }

    /* How many pollers run now (checked by the parent: the count of
     * processes it really started). */
    static int running() { return count(); }

    int rank_cpu() const { return rank_cpu_; }
    size_t pollers() const { return others_.size(); }

private:
    static constexpr int kMax = 1024;

    static pid_t *pids()
    {
        static pid_t p[kMax];
        return p;
    }

    static int &count()
    {
        static int n = 0;
        return n;
    }

    /* async-signal-safe */
    static void kill_all()
    {
        for (int i = 0; i < count(); ++i) {
            kill(pids()[i], SIGKILL);
        }
    }

    static void on_signal(int sig)
    {
        kill_all();
        signal(sig, SIG_DFL);
        raise(sig);
    }

    static void install_handlers()
    {
        static bool done = false;
        if (done) {
            return;
        }
        done = true;
        atexit(stop);
        for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
            struct sigaction sa = {};
            sa.sa_handler = on_signal;
            sigemptyset(&sa.sa_mask);
            sigaction(sig, &sa, nullptr);
        }
    }

    [[noreturn]] static void poll_forever(pid_t parent, int cpu, int ready_fd)
    {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            _exit(0); /* the parent died before the line above */
        }
        for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
            signal(sig, SIG_DFL);
        }
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0) {
            _exit(1);
        }
        (void)!write(ready_fd, "x", 1);
        close(ready_fd);
        /* a progress loop: load a completion word, never sleep */
        static volatile uint64_t cq[8];
        for (uint64_t i = 0;; ++i) {
            if (cq[i & 7] == ~0ull) {
                cq[0] = i;
            }
        }
    }

    int              rank_cpu_ = -1;
    std::vector<int> others_;
};

} // namespace bench

#endif
