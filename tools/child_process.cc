#include "child_process.h"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <poll.h>
#include <dirent.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace kreg_tools {
namespace {

#if defined(__SANITIZE_ADDRESS__)
/* Whether every other thread of this process sleeps (state S in its stat). */
bool other_threads_sleep()
{
    DIR *d = opendir("/proc/self/task");
    if (d == nullptr) {
        return true;
    }
    const std::string self = std::to_string(gettid());
    bool all = true;
    while (struct dirent *e = readdir(d)) {
        if ((e->d_name[0] == '.') || (self == e->d_name)) {
            continue;
        }
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/self/task/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == nullptr) {
            continue; /* it exited */
        }
        const size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *paren = strrchr(buf, ')');
        if ((paren != nullptr) && (paren[1] == ' ') && (paren[2] != 'S')) {
            all = false;
            break;
        }
    }
    closedir(d);
    return all;
}
#endif

/* ASan fork during thread start: GCC 12's libasan does not lock its
 * allocator across fork(), and a new thread allocates while ASan sets it
 * up. A fork right after UCS started a thread (ucs_rcache_create() starts
 * its async thread and does not wait for it) copied that lock held: the
 * child's first thread hung in ASan's allocator (fork rows of the matrix,
 * 3 of 25 runs). Under ASan, fork once the other threads sleep (at most
 * 2 s); glibc's malloc is fork-safe and needs none of this. */
void settle_threads_before_fork()
{
#if defined(__SANITIZE_ADDRESS__)
    for (int i = 0; i < 2000; ++i) {
        if (other_threads_sleep()) {
            return;
        }
        usleep(1000);
    }
#endif
}

/* Forks; the child redirects its output to the pipe and runs child_main,
 * whose return value it exits with. The parent collects the output until
 * the child closes it or the timeout passes, then reaps it. */
child_result spawn(const std::function<int()> &child_main, int timeout_s,
                  bool capture_stderr)
{
    child_result res;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        res.output = std::string("pipe: ") + strerror(errno);
        res.status = 126;
        return res;
    }
    fflush(stdout);
    fflush(stderr);
    settle_threads_before_fork();
    const pid_t pid = fork();
    if (pid < 0) {
        res.output = std::string("fork: ") + strerror(errno);
        res.status = 126;
        close(fds[0]);
        close(fds[1]);
        return res;
    }
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        if (capture_stderr) {
            dup2(fds[1], STDERR_FILENO);
        }
        const int rc = child_main();
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    close(fds[1]);

    const time_t deadline = (timeout_s > 0) ? time(nullptr) + timeout_s : 0;
    auto left_ms = [&]() -> int {
        return deadline ? static_cast<int>(deadline - time(nullptr)) * 1000 : -1;
    };
    bool timed_out = false;
    char buf[4096];
    for (;;) {
        const int left = left_ms();
        if (deadline && (left <= 0)) {
            timed_out = true;
            break;
        }
        struct pollfd pfd = {fds[0], POLLIN, 0};
        const int r = poll(&pfd, 1, left);
        if ((r < 0) && (errno == EINTR)) {
            continue;
        }
        if (r == 0) {
            timed_out = true;
            break;
        }
        const ssize_t n = read(fds[0], buf, sizeof(buf));
        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        res.output.append(buf, static_cast<size_t>(n));
    }
    close(fds[0]);

    /* the child closed its output; give it the rest of the time to exit */
    int st = 0;
    for (;;) {
        if (timed_out) {
            kill(pid, SIGKILL);
            while ((waitpid(pid, &st, 0) < 0) && (errno == EINTR)) {
            }
            break;
        }
        const pid_t w = waitpid(pid, &st, deadline ? WNOHANG : 0);
        if ((w == pid) || ((w < 0) && (errno != EINTR))) {
            break;
        }
        timed_out = deadline && (time(nullptr) >= deadline);
        usleep(1000);
    }
    res.status = timed_out ? -1 :
                 WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return res;
}

} // namespace

child_result run_child(const std::function<int()> &fn, int timeout_s,
                      bool capture_stderr)
{
    return spawn(fn, timeout_s, capture_stderr);
}

child_result run_self(const std::string &name, const std::vector<std::string> &args,
                     const std::vector<env_change> &env, int timeout_s,
                     bool capture_stderr)
{
    return spawn(
            [&]() {
                for (const env_change &e : env) {
                    if (e.second) {
                        setenv(e.first.c_str(), e.second->c_str(), 1);
                    } else {
                        unsetenv(e.first.c_str());
                    }
                }
                std::vector<char *> argv;
                argv.push_back(const_cast<char *>(name.c_str()));
                for (const std::string &a : args) {
                    argv.push_back(const_cast<char *>(a.c_str()));
                }
                argv.push_back(nullptr);
                execv("/proc/self/exe", argv.data());
                fprintf(stderr, "exec /proc/self/exe: %s\n", strerror(errno));
                return 127;
            },
            timeout_s, capture_stderr);
}

} // namespace kreg_tools
