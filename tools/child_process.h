/* Running a piece of a test or benchmark in a child process: a function in
 * a fork, or this very program again with other arguments and environment
 * (hooks and UCX's external declaration are process-global, so each
 * configuration needs its own process). Output is collected; a child that
 * outlives its timeout is killed. */
#ifndef KREG_TOOLS_CHILD_PROCESS_H
#define KREG_TOOLS_CHILD_PROCESS_H

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kreg_tools {

struct child_result {
    int         status = -1;    /* exit code, 128+signal, or -1 on timeout */
    std::string output;         /* stdout, and stderr where asked */
    bool        timed_out() const { return status == -1; }
};

/* NAME=VALUE to set, or NAME with no value to unset */
using env_change = std::pair<std::string, std::optional<std::string>>;

/* fn in a forked child; its return value is the exit code. timeout_s 0:
 * none. */
child_result run_child(const std::function<int()> &fn, int timeout_s = 20,
                      bool capture_stderr = true);

/* /proc/self/exe with args (argv[0] is `name`) and env changes. */
child_result run_self(const std::string &name, const std::vector<std::string> &args,
                     const std::vector<env_change> &env, int timeout_s = 0,
                     bool capture_stderr = false);

} // namespace kreg_tools

#endif
