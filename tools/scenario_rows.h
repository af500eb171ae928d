/* The scenario table's rows kept apart from scenarios.cc, which holds the
 * table: the rows whose memory is shared (SysV, shmem, files), in
 * scenarios_shared.cc. Internal to tools/. */
#ifndef KREG_TOOLS_SCENARIO_ROWS_H
#define KREG_TOOLS_SCENARIO_ROWS_H

#include "scenario_oracle.h"

#include <string>

namespace kreg_tools {

/* The buffer every row caches and changes. */
constexpr size_t kRowLen = 256 * KiB;

std::string s_madv_remove_shmem(ctx &c);
std::string s_shmdt(ctx &c);
std::string s_shmat_remap(ctx &c);
std::string s_file_private(ctx &c);
std::string s_file_shared(ctx &c);
std::string s_shmem_punch_hole(ctx &c);
std::string s_shmem_truncate(ctx &c);

} // namespace kreg_tools

#endif
