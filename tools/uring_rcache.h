/*
 * A real UCS rcache whose registrations are io_uring fixed buffers.
 *
 * Registering a fixed buffer pins the pages exactly as ibv_reg_mr does, and
 * IORING_OP_WRITE_FIXED reads them through the pinned pages, not through the
 * process's page tables: a stale cache entry therefore shows the old data,
 * just as a NIC would. transfer() is the "NIC": it looks the range up in the
 * rcache, writes it from the fixed buffer into a pipe and returns what came
 * out.
 */
#ifndef KREG_TOOLS_URING_RCACHE_H
#define KREG_TOOLS_URING_RCACHE_H

#include <liburing.h>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct ucs_rcache;

namespace kreg_tools {

enum class source {
    hooks,   /* UCX's stock UCM hooks, plain ucs_rcache             */
    kernel,  /* libucm_kernel: watch on register, prepare on lookup */
    none     /* external declaration, nothing watches: must go stale */
};

const char *source_name(source s);
bool source_parse(const std::string &name, source *s);

struct uring_rcache_counters {
    uint64_t registrations = 0; /* fixed-buffer slots filled by mem_reg  */
    uint64_t deregistrations = 0;
    uint64_t hits = 0;          /* lookups served without a registration */
    uint64_t uncached = 0;      /* register, use, unregister fallbacks   */
    uint64_t watch_refusals = 0;/* kreg_watch() returned 0              */
};

class uring_rcache {
public:
    /* Throws std::runtime_error on failure (message says what failed).
     * kernel: if libucm_kernel can't start, runs with no cache at all
     * (every transfer uncached), as UCX's md does without an rcache. */
    explicit uring_rcache(source src, unsigned slots = 256);
    ~uring_rcache();
    uring_rcache(const uring_rcache &) = delete;
    uring_rcache &operator=(const uring_rcache &) = delete;

    /* Look [addr, addr+len) up (registering on a miss) and send it from the
     * fixed buffer through a pipe. Returns the bytes read back, or throws. */
    std::vector<unsigned char> transfer(const void *addr, size_t len);

    const uring_rcache_counters &counters() const { return m_counters; }
    source src() const { return m_src; }
    bool cached() const { return m_rcache != nullptr; }
    /* Last kreg_watch() refusal reason (kreg_reason_t), 0 if none. */
    int last_refusal() const { return m_last_refusal; }
    /* errno of the last failed fixed-buffer registration, 0 if none. */
    int last_reg_errno() const { return m_last_reg_errno; }

private:
    struct region;
    friend struct uring_rcache_ops;

    int slot_get();
    void slot_put(int slot);
    int buf_register(void *start, size_t len); /* slot, or -errno */
    void buf_unregister(int slot);
    void write_fixed(int slot, const void *addr, size_t len,
                     std::vector<unsigned char> &out);

    source m_src;
    struct io_uring m_ring;
    bool m_ring_ok = false;
    int m_pipe[2] = {-1, -1};
    size_t m_pipe_size = 0;
    std::vector<int> m_free_slots;
    ucs_rcache *m_rcache = nullptr;
    bool m_kreg_started = false;
    uring_rcache_counters m_counters;
    int m_last_refusal = 0;
    int m_last_reg_errno = 0;
};

} // namespace kreg_tools

#endif
