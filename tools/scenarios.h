/*
 * The scenario table's rows: every way of changing the address space under
 * a cached registration (scenarios.cc), run by kreg_scenarios with the
 * oracle of scenario_oracle.h.
 */
#ifndef KREG_TOOLS_SCENARIOS_H
#define KREG_TOOLS_SCENARIOS_H

#include "scenario_oracle.h"

#include <string>
#include <vector>

namespace kreg_tools {

struct scenario {
    const char *name;
    std::string (*run)(ctx &);
    const char *malloc_conf; /* non-null: run with jemalloc preloaded */
    const char *what;
    bool        exits_with_live_threads = false; /* LeakSanitizer off */
};

std::vector<const scenario *> scenarios();
const scenario *find_scenario(const std::string &name);

} // namespace kreg_tools

#endif
