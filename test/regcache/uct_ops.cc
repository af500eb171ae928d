/*
 * The ib_regcache component's transports at UCT level, over a verbs device
 * (Soft-RoCE in the VM): two ifaces of rc_kreg connected ep to ep, two of
 * ud_kreg connected ep to iface, every byte checked on the receiver.
 *
 *   uct_ops [GTEST OPTIONS] [DEVICE]
 *
 *   rc_kreg.*   put short/bcopy/zcopy, get bcopy/zcopy (UD has no RMA: those
 *               names exist for RC only), ep and iface flush after a batch
 *               of puts, the zcopy remap case through put_zcopy
 *   ud_kreg.*   ep and iface flush after a batch of active messages
 *   kreg/am.*   (both transports) am short/bcopy/zcopy, pending (send queue
 *               full, pending requests dispatched in order), pending purge,
 *               the zcopy remap case through am_zcopy
 *
 * The remap case is the component's point: a buffer registered through its
 * md and sent zcopy, then unmapped and mapped again at the same address with
 * raw syscalls (no UCM hook sees them) and new contents; registering it again
 * must give a new registration, and the receiver must get the new bytes.
 *
 * Exits 77 ("skip: ...") when the component is not registered or has no
 * verbs device (the host).
 *
 * Over 350 lines: one program, the connected pair fixture (open,
 * connect, progress, byte checks: most of the file) and the tests on it.
 * It runs only in the Soft-RoCE VM; splitting the fixture into a file of
 * its own is left for a change that can run the VM suite to check it.
 */
#include "test_buffers.h"
#include "uct_component.h"

#include <ucm_kernel/ucm_kernel.h>
#include <uct/api/uct.h>

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <vector>

extern "C" ucs_status_t kreg_ib_regcache_status(void);

namespace {

uct_component_h g_component;
std::string g_md_name;
constexpr uint8_t AM_ID     = 7;
constexpr size_t SIZE_CAP   = 1 << 20; /* largest message tried */
constexpr double TIMEOUT_S  = 60;      /* TCG is slow */

/* Byte i of message `seed`: a pattern in which a shifted or stale copy shows */
char pattern(uint64_t seed, size_t i)
{
    return static_cast<char>((seed * 131 + i * 7 + (i >> 8)) & 0xff);
}

void fill(void *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; ++i) {
        static_cast<char*>(p)[i] = pattern(seed, i);
    }
}

std::string expected(size_t n, uint64_t seed)
{
    std::string s(n, '\0');
    fill(s.data(), n, seed);
    return s;
}

/* Where two byte strings first differ, for a failure message */
std::string first_diff(const std::string &got, const std::string &want)
{
    size_t i = 0;
    while ((i < got.size()) && (i < want.size()) && (got[i] == want[i])) {
        ++i;
    }
    return "length " + std::to_string(got.size()) + " (want " +
           std::to_string(want.size()) + "), first difference at byte " +
           std::to_string(i);
}

#define EXPECT_BYTES(got, want) \
    EXPECT_TRUE((got) == (want)) << first_diff(got, want)

/* Sizes to try between lo and hi (hi included when under the cap) */
std::vector<size_t> sizes(size_t lo, size_t hi)
{
    std::vector<size_t> v;
    for (size_t n : {1ul, 8ul, 100ul, 4096ul, 65536ul, SIZE_CAP}) {
        if ((n >= lo) && (n < hi)) {
            v.push_back(n);
        }
    }
    if ((hi >= lo) && (hi <= SIZE_CAP)) {
        v.push_back(hi);
    }
    return v;
}

struct comp : uct_completion_t {
    bool done;
    comp() { reset(); }
    void reset() { func = cb; count = 1; status = UCS_OK; done = false; }
    static void cb(uct_completion_t *self) { static_cast<comp*>(self)->done = true; }
};

/* One side: async context, worker, md of the component, iface, its ep */
struct entity {
    ucs_async_context_t *async = nullptr;
    uct_worker_h worker        = nullptr;
    uct_md_h md                = nullptr;
    uct_md_attr_t md_attr      = {};
    uct_iface_h iface          = nullptr;
    uct_iface_attr_t attr      = {};
    uct_ep_h ep                = nullptr;
    std::vector<std::string> rx; /* active messages received: header+payload */

    static ucs_status_t am_cb(void *arg, void *data, size_t length, unsigned)
    {
        static_cast<entity*>(arg)->rx.emplace_back(static_cast<char*>(data),
                                                   length);
        return UCS_OK;
    }

    void close()
    {
        if (ep)     uct_ep_destroy(ep);
        if (iface)  uct_iface_close(iface);
        if (worker) uct_worker_destroy(worker);
        if (md)     uct_md_close(md);
        if (async)  ucs_async_context_destroy(async);
        ep = nullptr; iface = nullptr; worker = nullptr; md = nullptr;
        async = nullptr;
    }
};

/* A page-aligned anonymous buffer, registered through an entity's md */
struct region {
    entity &e;
    size_t len;
    char *p;
    uct_mem_h memh          = nullptr;
    uct_rkey_bundle_t rkey  = {};
    bool rkey_valid         = false;

    region(entity &owner, size_t n) : e(owner), len(n)
    {
        p = static_cast<char*>(mmap(nullptr, len, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        if (p == MAP_FAILED) {
            p = nullptr;
            ADD_FAILURE() << "mmap " << len << ": " << strerror(errno);
            return;
        }
        memset(p, 0, len);
        if (uct_md_mem_reg(e.md, p, len, UCT_MD_MEM_ACCESS_ALL, &memh) !=
            UCS_OK) {
            memh = nullptr;
            ADD_FAILURE() << "uct_md_mem_reg " << len;
            return;
        }
        std::vector<char> packed(e.md_attr.rkey_packed_size);
        rkey_valid = (uct_md_mkey_pack(e.md, memh, packed.data()) == UCS_OK) &&
                     (uct_rkey_unpack(g_component, packed.data(), &rkey) ==
                      UCS_OK);
        EXPECT_TRUE(rkey_valid) << "rkey pack/unpack";
    }

    ~region()
    {
        if (rkey_valid) uct_rkey_release(g_component, &rkey);
        if (memh)       uct_md_mem_dereg(e.md, memh);
        if (p)          munmap(p, len);
    }

    bool ok() const { return p && memh && rkey_valid; }
    uint64_t addr(size_t off = 0) const { return (uintptr_t)(p + off); }
    std::string bytes(size_t n, size_t off = 0) const { return {p + off, n}; }
};

uint64_t watch_calls()
{
    kreg_stats_t s;
    kreg_get_stats(&s);
    return s.watch_calls;
}

/* Sender s and receiver r on one transport of the component */
class pair : public ::testing::Test {
protected:
    entity s, r;
    std::string tl;

    void open(const std::string &tl_name)
    {
        tl = tl_name;
        open_entity(s);
        if (HasFatalFailure() || IsSkipped()) return;
        open_entity(r);
        if (HasFatalFailure()) return;
        if (s.attr.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_EP) {
            connect_ep_to_ep();
        } else {
            ASSERT_TRUE(s.attr.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_IFACE);
            connect_ep_to_iface();
        }
    }

    void TearDown() override
    {
        for (entity *e : {&s, &r}) {
            if (e->ep) {
                flush_ep(*e);
            }
            if (e->iface) {
                flush_iface(*e);
            }
        }
        s.close();
        r.close();
    }

    void open_entity(entity &e)
    {
        ASSERT_EQ(UCS_OK, ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK,
                                                   &e.async));
        ASSERT_EQ(UCS_OK, uct_worker_create(e.async, UCS_THREAD_MODE_SINGLE,
                                            &e.worker));
        uct_md_config_t *md_config;
        ASSERT_EQ(UCS_OK, uct_md_config_read(g_component, nullptr, nullptr,
                                             &md_config));
        ucs_status_t st = uct_md_open(g_component, g_md_name.c_str(),
                                      md_config, &e.md);
        uct_config_release(md_config);
        ASSERT_EQ(UCS_OK, st) << "uct_md_open " << g_md_name;
        ASSERT_EQ(UCS_OK, uct_md_query(e.md, &e.md_attr));
        ASSERT_STREQ("ib_regcache", e.md_attr.component_name);

        uct_tl_resource_desc_t *res;
        unsigned n;
        ASSERT_EQ(UCS_OK, uct_md_query_tl_resources(e.md, &res, &n));
        std::string dev;
        for (unsigned i = 0; (i < n) && dev.empty(); ++i) {
            if (tl == res[i].tl_name) {
                dev = res[i].dev_name;
            }
        }
        uct_release_tl_resource_list(res);
        if (dev.empty()) {
            GTEST_SKIP() << "md " << g_md_name << " has no " << tl << " resource";
        }

        uct_iface_config_t *config;
        ASSERT_EQ(UCS_OK, uct_md_iface_config_read(e.md, tl.c_str(), nullptr,
                                                   nullptr, &config));
        uct_iface_params_t params = {};
        params.field_mask           = UCT_IFACE_PARAM_FIELD_OPEN_MODE |
                                      UCT_IFACE_PARAM_FIELD_DEVICE;
        params.open_mode            = UCT_IFACE_OPEN_MODE_DEVICE;
        params.mode.device.tl_name  = tl.c_str();
        params.mode.device.dev_name = dev.c_str();
        st = uct_iface_open(e.md, e.worker, &params, config, &e.iface);
        uct_config_release(config);
        ASSERT_EQ(UCS_OK, st) << "uct_iface_open " << tl << "/" << dev;
        ASSERT_EQ(UCS_OK, uct_iface_query(e.iface, &e.attr));
        uct_iface_progress_enable(e.iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
        ASSERT_EQ(UCS_OK, uct_iface_set_am_handler(e.iface, AM_ID,
                                                   entity::am_cb, &e, 0));
    }

    static void create_ep(entity &e, uct_ep_params_t &params)
    {
        params.field_mask |= UCT_EP_PARAM_FIELD_IFACE;
        params.iface       = e.iface;
        ASSERT_EQ(UCS_OK, uct_ep_create(&params, &e.ep));
    }

    /* RC: each side's ep is connected to the other's */
    void connect_ep_to_ep()
    {
        uct_ep_params_t params = {};
        create_ep(s, params);
        if (HasFatalFailure()) return;
        params = {};
        create_ep(r, params);
        if (HasFatalFailure()) return;
        for (auto [from, to] : {std::pair{&s, &r}, std::pair{&r, &s}}) {
            std::vector<char> dev(to->attr.device_addr_len);
            std::vector<char> addr(to->attr.ep_addr_len);
            auto *dev_addr = reinterpret_cast<uct_device_addr_t*>(dev.data());
            auto *ep_addr  = reinterpret_cast<uct_ep_addr_t*>(addr.data());
            ASSERT_EQ(UCS_OK, uct_iface_get_device_address(to->iface, dev_addr));
            ASSERT_EQ(UCS_OK, uct_ep_get_address(to->ep, ep_addr));
            ASSERT_EQ(UCS_OK, uct_ep_connect_to_ep(from->ep, dev_addr, ep_addr));
        }
    }

    /* UD: the sender's ep goes to the receiver's iface */
    void connect_ep_to_iface()
    {
        std::vector<char> dev(r.attr.device_addr_len), addr(r.attr.iface_addr_len);
        uct_ep_params_t params = {};
        params.field_mask = UCT_EP_PARAM_FIELD_DEV_ADDR |
                            UCT_EP_PARAM_FIELD_IFACE_ADDR;
        params.dev_addr   = reinterpret_cast<uct_device_addr_t*>(dev.data());
        params.iface_addr = reinterpret_cast<uct_iface_addr_t*>(addr.data());
        ASSERT_EQ(UCS_OK, uct_iface_get_device_address(r.iface,
                      const_cast<uct_device_addr_t*>(params.dev_addr)));
        ASSERT_EQ(UCS_OK, uct_iface_get_address(r.iface,
                      const_cast<uct_iface_addr_t*>(params.iface_addr)));
        create_ep(s, params);
        if (HasFatalFailure()) return;
        /* a flush completes once the connection is made (CREQ/CREP) */
        ASSERT_EQ(UCS_OK, flush_ep()) << "ud connection";
    }

    /* Progress s (and r unless sender_only) until done() or the timeout */
    bool wait_for(const std::function<bool()> &done, bool sender_only = false)
    {
        auto t0 = std::chrono::steady_clock::now();
        while (!done()) {
            uct_worker_progress(s.worker);
            if (!sender_only) {
                uct_worker_progress(r.worker);
            }
            if (seconds_since(t0) > TIMEOUT_S) {
                return false;
            }
        }
        return true;
    }

    static double seconds_since(std::chrono::steady_clock::time_point t0)
    {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             t0).count();
    }

    void progress_for(double seconds)
    {
        auto t0 = std::chrono::steady_clock::now();
        while (seconds_since(t0) < seconds) {
            uct_worker_progress(s.worker);
            uct_worker_progress(r.worker);
        }
    }

    /* op() until it has resources (progressing both sides meanwhile) */
    ucs_status_t retry(const std::function<ucs_status_t()> &op)
    {
        ucs_status_t st;
        wait_for([&] { return (st = op()) != UCS_ERR_NO_RESOURCE; });
        return st;
    }

    /* Status of an op that may complete later through c */
    ucs_status_t complete(ucs_status_t st, comp &c, bool sender_only = false)
    {
        if (st != UCS_INPROGRESS) {
            return st;
        }
        return wait_for([&] { return c.done; }, sender_only) ? c.status
                                                             : UCS_ERR_TIMED_OUT;
    }

    /* Completions live until the fixture ends: an op that outlives a failed
     * test still has somewhere to write */
    std::deque<comp> comps;
    comp &new_comp() { return comps.emplace_back(); }

    ucs_status_t flush_ep(entity &e, bool sender_only = false)
    {
        comp &c = new_comp();
        return complete(retry([&] { return uct_ep_flush(e.ep, 0, &c); }), c,
                        sender_only);
    }

    ucs_status_t flush_ep(bool sender_only = false) { return flush_ep(s, sender_only); }

    /* Polled (no completion): what UCX's RC and UD ifaces support */
    ucs_status_t flush_iface(entity &e, bool sender_only = false)
    {
        ucs_status_t st = UCS_ERR_TIMED_OUT;
        bool done = wait_for([&] {
            st = uct_iface_flush(e.iface, 0, nullptr);
            return (st != UCS_INPROGRESS) && (st != UCS_ERR_NO_RESOURCE);
        }, sender_only);
        return done ? st : UCS_ERR_TIMED_OUT;
    }

    /* With a completion where the iface supports it, else polled */
    ucs_status_t flush_iface_comp(entity &e, bool sender_only = false)
    {
        comp &c = new_comp();
        ucs_status_t st = retry([&] { return uct_iface_flush(e.iface, 0, &c); });
        if (st == UCS_ERR_UNSUPPORTED) {
            info("uct_iface_flush with a completion: unsupported by " + tl +
                 " (UCX's verbs transport), polled instead");
            return flush_iface(e, sender_only);
        }
        return complete(st, c, sender_only);
    }

    /* "info: <suite>.<test>: text" in the output */
    static void info(const std::string &text)
    {
        auto *t = ::testing::UnitTest::GetInstance()->current_test_info();
        std::printf("info: %s.%s: %s\n", t->test_suite_name(), t->name(),
                    text.c_str());
    }

    void show_sizes(const std::vector<size_t> &v) const
    {
        std::string t = "sizes";
        for (size_t n : v) {
            t += " " + std::to_string(n);
        }
        info(t);
    }

    void require(uint64_t flag, const char *what)
    {
        if (!(s.attr.cap.flags & flag)) {
            GTEST_SKIP() << tl << " has no " << what;
        }
    }

    /* --- active messages: 8-byte header (the sequence number) + payload --- */

    enum am_kind { SHORT, BCOPY, ZCOPY };
    uint64_t seq = 0;

    struct am_pack_arg { uint64_t hdr; const char *p; size_t n; };

    static size_t am_pack(void *dest, void *arg)
    {
        auto *a = static_cast<am_pack_arg*>(arg);
        memcpy(dest, &a->hdr, sizeof(a->hdr));
        memcpy(static_cast<char*>(dest) + sizeof(a->hdr), a->p, a->n);
        return sizeof(a->hdr) + a->n;
    }

    /* Largest payload of an AM kind after the 8-byte header */
    size_t am_max(am_kind k) const
    {
        const auto &am = s.attr.cap.am;
        size_t max = (k == SHORT) ? am.max_short :
                     (k == BCOPY) ? am.max_bcopy : am.max_zcopy;
        return (max > sizeof(uint64_t)) ? max - sizeof(uint64_t) : 0;
    }

    /* One send of payload [p, p+n) with header hdr; zcopy needs memh */
    ucs_status_t send_am(am_kind k, uint64_t hdr, const char *p, size_t n,
                         uct_mem_h memh, comp *c)
    {
        switch (k) {
        case SHORT:
            return uct_ep_am_short(s.ep, AM_ID, hdr, p, n);
        case BCOPY: {
            am_pack_arg a = {hdr, p, n};
            ssize_t len = uct_ep_am_bcopy(s.ep, AM_ID, am_pack, &a, 0);
            if (len < 0) {
                return static_cast<ucs_status_t>(len);
            }
            return (size_t(len) == sizeof(hdr) + n) ? UCS_OK : UCS_ERR_IO_ERROR;
        }
        default: {
            uct_iov_t iov = {const_cast<char*>(p), n, memh, 0, 1};
            return uct_ep_am_zcopy(s.ep, AM_ID, &hdr, sizeof(hdr), &iov, 1, 0, c);
        }
        }
    }

    /* Sends one message and waits until the receiver has it; returns its
     * payload after checking the header, or "" on a failure */
    std::string am_roundtrip(am_kind k, const char *p, size_t n, uct_mem_h memh)
    {
        comp &c = new_comp();
        uint64_t hdr  = ++seq;
        size_t before = r.rx.size();
        ucs_status_t st = complete(retry([&] {
            return send_am(k, hdr, p, n, memh, &c);
        }), c);
        EXPECT_EQ(UCS_OK, st) << "am send of " << n << " bytes";
        if ((st != UCS_OK) || !wait_for([&] { return r.rx.size() > before; })) {
            ADD_FAILURE() << "message of " << n << " bytes not received";
            return "";
        }
        EXPECT_EQ(before + 1, r.rx.size()) << "one message, one delivery";
        const std::string &m = r.rx.back();
        if (m.size() < sizeof(hdr)) {
            ADD_FAILURE() << "message of " << m.size() << " bytes has no header";
            return "";
        }
        uint64_t got;
        memcpy(&got, m.data(), sizeof(got));
        EXPECT_EQ(hdr, got) << "am header";
        return m.substr(sizeof(hdr));
    }

    void am_sizes(am_kind k)
    {
        size_t lo = (k == ZCOPY) ? std::max<size_t>(1, s.attr.cap.am.min_zcopy) : 1;
        if (k == ZCOPY) {
            ASSERT_GE(s.attr.cap.am.max_hdr, sizeof(uint64_t));
        }
        auto v = sizes(lo, am_max(k));
        ASSERT_FALSE(v.empty()) << "no payload size fits " << am_max(k);
        show_sizes(v);
        region src(s, v.back());
        ASSERT_TRUE(src.ok());
        for (size_t n : v) {
            fill(src.p, n, n);
            std::string got = am_roundtrip(k, src.p, n, src.memh);
            EXPECT_BYTES(got, expected(n, n)) << " (payload of " << n << ")";
        }
    }

    /* --- pending: AM short sends until the send queue is full --- */

    struct pend_req {
        uct_pending_req_t uct; /* first: UCT hands back this address */
        pair *t;
        uint64_t hdr;
        int calls = 0, sent = 0;
        static ucs_status_t cb(uct_pending_req_t *self)
        {
            auto *req = reinterpret_cast<pend_req*>(self);
            ++req->calls;
            ucs_status_t st = req->t->send_seq(req->hdr);
            req->sent += (st == UCS_OK);
            return st;
        }
    };

    char small[8];
    ucs_status_t send_seq(uint64_t hdr)
    {
        memcpy(small, &hdr, sizeof(hdr));
        return uct_ep_am_short(s.ep, AM_ID, hdr, small, sizeof(small));
    }

    /* Sends 0, 1, ... without progress until one finds no resource, then
     * queues reqs (continuing the sequence); returns how many went out */
    uint64_t fill_queue(std::vector<pend_req> &reqs)
    {
        uint64_t n = 0;
        for (;;) {
            if (n > 100000) {
                ADD_FAILURE() << "no UCS_ERR_NO_RESOURCE after " << n << " sends";
                return n;
            }
            ucs_status_t st = send_seq(n);
            if (st == UCS_OK) {
                ++n;
                continue;
            }
            if (st != UCS_ERR_NO_RESOURCE) {
                ADD_FAILURE() << "am_short: " << ucs_status_string(st);
                return n;
            }
            reqs[0] = {{pend_req::cb, {}}, this, n};
            st      = uct_ep_pending_add(s.ep, &reqs[0].uct, 0);
            if (st == UCS_ERR_BUSY) {
                continue; /* resources came back: send more */
            }
            EXPECT_EQ(UCS_OK, st) << "uct_ep_pending_add";
            break;
        }
        for (size_t i = 1; i < reqs.size(); ++i) {
            reqs[i] = {{pend_req::cb, {}}, this, n + i};
            EXPECT_EQ(UCS_OK, uct_ep_pending_add(s.ep, &reqs[i].uct, 0));
        }
        return n;
    }

    /* Received messages are 0..count-1 in order, each carrying its number */
    void expect_sequence(uint64_t count)
    {
        ASSERT_EQ(count, r.rx.size());
        for (uint64_t i = 0; i < count; ++i) {
            std::string want(2 * sizeof(i), '\0');
            memcpy(want.data(), &i, sizeof(i));
            memcpy(want.data() + sizeof(i), &i, sizeof(i));
            ASSERT_TRUE(r.rx[i] == want) << "message " << i << " out of order "
                                            "or corrupt";
        }
    }

    /* --- the remap case --- */

    /* xfer(buf, memh, n) sends n bytes of buf registered as memh and returns
     * what the receiver got */
    using xfer_fn = std::function<std::string(char*, uct_mem_h, size_t)>;

    void remap_case(size_t n, const xfer_fn &xfer)
    {
        const size_t len = 65536;
        n = std::min(n, len);
        ASSERT_GT(n, 0u);
        char *buf = static_cast<char*>(mmap(nullptr, len, PROT_READ | PROT_WRITE,
                                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        ASSERT_NE(MAP_FAILED, buf);
        /* no huge page: khugepaged collapsing a merged neighbourhood would
         * change the pages between the two registrations below (a correct
         * miss, which this case does not mean to test) */
        madvise(buf, len, MADV_NOHUGEPAGE);
        fill(buf, len, 1);

        uct_mem_h old_memh, hit, memh;
        ASSERT_EQ(UCS_OK, uct_md_mem_reg(s.md, buf, len, UCT_MD_MEM_ACCESS_ALL,
                                         &old_memh));
        kreg_stats_t s0, s1;
        kreg_get_stats(&s0);
        ASSERT_EQ(UCS_OK, uct_md_mem_reg(s.md, buf, len, UCT_MD_MEM_ACCESS_ALL,
                                         &hit));
        kreg_get_stats(&s1);
        /* why, if it missed: the lookup found the kernel's counter moved
         * (stale_hits), or an event removed the entry (dispatched) */
        EXPECT_EQ(s0.watch_calls, s1.watch_calls)
            << "a second registration is a cache hit (meanwhile: stale_hits +"
            << s1.stale_hits - s0.stale_hits << ", ranges dispatched +"
            << s1.dispatched - s0.dispatched << ")";
        uct_md_mem_dereg(s.md, hit);
        EXPECT_BYTES(xfer(buf, old_memh, n), expected(n, 1)) << " (first send)";

        /* raw syscalls: no UCM hook sees these, only the kernel does */
        if (!raw_remap(buf, len)) {
            uct_md_mem_dereg(s.md, old_memh);
            GTEST_SKIP() << "the address was taken before it could be mapped again";
        }
        fill(buf, len, 2);

        uint64_t w = watch_calls();
        ASSERT_EQ(UCS_OK, uct_md_mem_reg(s.md, buf, len, UCT_MD_MEM_ACCESS_ALL,
                                         &memh));
        EXPECT_EQ(w + 1, watch_calls()) << "the remapped buffer is registered anew";
        EXPECT_BYTES(xfer(buf, memh, n), expected(n, 2)) << " (after the remap)";
        /* control: a registration from before the remap still holds the old
         * pages, as a stale cache entry would: the oracle can fail */
        EXPECT_BYTES(xfer(buf, old_memh, n), expected(n, 1))
            << " (old registration, expected the old bytes)";
        uct_md_mem_dereg(s.md, memh);
        uct_md_mem_dereg(s.md, old_memh);
        munmap(buf, len);
    }
};

/* ------------------------------------------------------------------------ */

class rc_kreg : public pair {
protected:
    void SetUp() override { open("rc_kreg"); }

    struct copy_arg { char *p; size_t n; };
    static size_t pack(void *dest, void *arg)
    {
        auto *a = static_cast<copy_arg*>(arg);
        memcpy(dest, a->p, a->n);
        return a->n;
    }
    static void unpack(void *arg, const void *data, size_t length)
    {
        auto *a = static_cast<copy_arg*>(arg);
        memcpy(a->p, data, std::min(length, a->n));
        a->n = length;
    }

    /* Target buffer of the receiver, zeroed, with a guard byte after n */
    void put_sizes(size_t lo, size_t hi,
                   const std::function<ucs_status_t(char*, size_t, region&,
                                                    region&, comp&)> &put)
    {
        auto v = sizes(lo, hi);
        ASSERT_FALSE(v.empty()) << "no size fits " << lo << ".." << hi;
        show_sizes(v);
        region src(s, v.back()), dst(r, v.back() + 1);
        ASSERT_TRUE(src.ok() && dst.ok());
        for (size_t n : v) {
            memset(dst.p, 0, n + 1);
            fill(src.p, n, n);
            comp &c = new_comp();
            ASSERT_EQ(UCS_OK, complete(retry([&] {
                return put(src.p, n, src, dst, c);
            }), c)) << "put of " << n;
            ASSERT_EQ(UCS_OK, flush_ep());
            EXPECT_BYTES(dst.bytes(n), expected(n, n)) << " (put of " << n << ")";
            EXPECT_EQ(0, dst.p[n]) << "byte after a put of " << n;
        }
    }

    void get_sizes(size_t lo, size_t hi,
                   const std::function<ucs_status_t(region&, size_t, region&,
                                                    comp&)> &get)
    {
        auto v = sizes(lo, hi);
        ASSERT_FALSE(v.empty()) << "no size fits " << lo << ".." << hi;
        show_sizes(v);
        region local(s, v.back() + 1), remote(r, v.back());
        ASSERT_TRUE(local.ok() && remote.ok());
        for (size_t n : v) {
            memset(local.p, 0, n + 1);
            fill(remote.p, n, n + 3);
            comp &c = new_comp();
            ASSERT_EQ(UCS_OK, complete(retry([&] {
                return get(local, n, remote, c);
            }), c)) << "get of " << n;
            EXPECT_BYTES(local.bytes(n), expected(n, n + 3)) << " (get of " << n << ")";
            EXPECT_EQ(0, local.p[n]) << "byte after a get of " << n;
        }
    }

    /* 32 zcopy puts of 4 KiB to distinct offsets, no waiting between them;
     * then flush() progressing the sender only: every chunk must be there */
    void put_batch_then(const std::function<ucs_status_t()> &flush)
    {
        require(UCT_IFACE_FLAG_PUT_ZCOPY, "put_zcopy");
        const size_t chunk = 4096, count = 32;
        ASSERT_LE(chunk, s.attr.cap.put.max_zcopy);
        region src(s, chunk * count), dst(r, chunk * count);
        ASSERT_TRUE(src.ok() && dst.ok());
        fill(src.p, chunk * count, 9);
        std::vector<comp*> c(count);
        for (size_t i = 0; i < count; ++i) {
            c[i] = &new_comp();
            uct_iov_t iov = {src.p + i * chunk, chunk, src.memh, 0, 1};
            ucs_status_t st = retry([&] {
                return uct_ep_put_zcopy(s.ep, &iov, 1, dst.addr(i * chunk),
                                        dst.rkey.rkey, c[i]);
            });
            ASSERT_TRUE((st == UCS_OK) || (st == UCS_INPROGRESS))
                << ucs_status_string(st);
            c[i]->done |= (st == UCS_OK);
        }
        ASSERT_EQ(UCS_OK, flush());
        for (size_t i = 0; i < count; ++i) {
            EXPECT_TRUE(c[i]->done) << "put " << i << " not completed after flush";
        }
        EXPECT_BYTES(dst.bytes(chunk * count), expected(chunk * count, 9));
    }
};

TEST_F(rc_kreg, put_short)
{
    require(UCT_IFACE_FLAG_PUT_SHORT, "put_short");
    put_sizes(1, s.attr.cap.put.max_short,
              [&](char *p, size_t n, region &, region &dst, comp &) {
                  return uct_ep_put_short(s.ep, p, n, dst.addr(), dst.rkey.rkey);
              });
}

TEST_F(rc_kreg, put_bcopy)
{
    require(UCT_IFACE_FLAG_PUT_BCOPY, "put_bcopy");
    put_sizes(1, s.attr.cap.put.max_bcopy,
              [&](char *p, size_t n, region &, region &dst, comp &) {
                  copy_arg a = {p, n};
                  ssize_t len = uct_ep_put_bcopy(s.ep, pack, &a, dst.addr(),
                                                 dst.rkey.rkey);
                  return (len < 0) ? ucs_status_t(len) :
                         (size_t(len) == n) ? UCS_OK : UCS_ERR_IO_ERROR;
              });
}

TEST_F(rc_kreg, put_zcopy)
{
    require(UCT_IFACE_FLAG_PUT_ZCOPY, "put_zcopy");
    put_sizes(std::max<size_t>(1, s.attr.cap.put.min_zcopy),
              s.attr.cap.put.max_zcopy,
              [&](char *p, size_t n, region &src, region &dst, comp &c) {
                  uct_iov_t iov = {p, n, src.memh, 0, 1};
                  return uct_ep_put_zcopy(s.ep, &iov, 1, dst.addr(),
                                          dst.rkey.rkey, &c);
              });
}

TEST_F(rc_kreg, get_bcopy)
{
    require(UCT_IFACE_FLAG_GET_BCOPY, "get_bcopy");
    copy_arg a;
    get_sizes(1, s.attr.cap.get.max_bcopy,
              [&](region &local, size_t n, region &remote, comp &c) {
                  a = {local.p, n};
                  return uct_ep_get_bcopy(s.ep, unpack, &a, n, remote.addr(),
                                          remote.rkey.rkey, &c);
              });
}

TEST_F(rc_kreg, get_zcopy)
{
    require(UCT_IFACE_FLAG_GET_ZCOPY, "get_zcopy");
    get_sizes(std::max<size_t>(1, s.attr.cap.get.min_zcopy),
              s.attr.cap.get.max_zcopy,
              [&](region &local, size_t n, region &remote, comp &c) {
                  uct_iov_t iov = {local.p, n, local.memh, 0, 1};
                  return uct_ep_get_zcopy(s.ep, &iov, 1, remote.addr(),
                                          remote.rkey.rkey, &c);
              });
}

TEST_F(rc_kreg, flush_ep)
{
    put_batch_then([&] { return flush_ep(true); });
}

TEST_F(rc_kreg, flush_iface)
{
    put_batch_then([&] { return flush_iface_comp(s, true); });
}

TEST_F(rc_kreg, zcopy_remap_put)
{
    require(UCT_IFACE_FLAG_PUT_ZCOPY, "put_zcopy");
    region dst(r, 65536);
    ASSERT_TRUE(dst.ok());
    remap_case(s.attr.cap.put.max_zcopy, [&](char *p, uct_mem_h memh, size_t n) {
        memset(dst.p, 0, n);
        uct_iov_t iov = {p, n, memh, 0, 1};
        comp &c = new_comp();
        ucs_status_t st = complete(retry([&] {
            return uct_ep_put_zcopy(s.ep, &iov, 1, dst.addr(), dst.rkey.rkey, &c);
        }), c);
        EXPECT_EQ(UCS_OK, st);
        EXPECT_EQ(UCS_OK, flush_ep());
        return dst.bytes(n);
    });
}

/* ------------------------------------------------------------------------ */

class ud_kreg : public pair {
protected:
    void SetUp() override { open("ud_kreg"); }

    /* count AMs sent without waiting, flush() progressing both sides; then
     * with the sender idle, the receiver must deliver all of them */
    void am_batch_then(const std::function<ucs_status_t()> &flush)
    {
        const uint64_t count = 64;
        for (uint64_t i = 0; i < count; ++i) {
            ASSERT_EQ(UCS_OK, retry([&] { return send_seq(i); }));
        }
        ASSERT_EQ(UCS_OK, flush());
        EXPECT_EQ(UCS_OK, uct_ep_flush(s.ep, 0, nullptr))
            << "nothing outstanding after the flush completed";
        auto t0 = std::chrono::steady_clock::now();
        while ((r.rx.size() < count) && (seconds_since(t0) < 10)) {
            uct_worker_progress(r.worker); /* the sender stays idle */
        }
        expect_sequence(count);
    }
};

/* UD has no RMA: put and get tests exist for rc_kreg only */
TEST_F(ud_kreg, has_no_rma)
{
    const uint64_t rma = UCT_IFACE_FLAG_PUT_SHORT | UCT_IFACE_FLAG_PUT_BCOPY |
                         UCT_IFACE_FLAG_PUT_ZCOPY | UCT_IFACE_FLAG_GET_BCOPY |
                         UCT_IFACE_FLAG_GET_ZCOPY;
    EXPECT_EQ(0u, s.attr.cap.flags & rma)
        << "ud_kreg reports RMA: add put/get tests for it";
}

TEST_F(ud_kreg, flush_ep)
{
    am_batch_then([&] { return flush_ep(); });
}

TEST_F(ud_kreg, flush_iface)
{
    am_batch_then([&] { return flush_iface_comp(s); });
}

/* ------------------------------------------------------------------------ */

class am : public pair, public ::testing::WithParamInterface<std::string> {
protected:
    void SetUp() override { open(GetParam()); }
};

TEST_P(am, am_short)
{
    require(UCT_IFACE_FLAG_AM_SHORT, "am_short");
    am_sizes(SHORT);
}

TEST_P(am, am_bcopy)
{
    require(UCT_IFACE_FLAG_AM_BCOPY, "am_bcopy");
    am_sizes(BCOPY);
}

TEST_P(am, am_zcopy)
{
    require(UCT_IFACE_FLAG_AM_ZCOPY, "am_zcopy");
    am_sizes(ZCOPY);
}

/* Send queue full, three requests pending: dispatched once each, in order,
 * after everything sent before them */
TEST_P(am, pending)
{
    require(UCT_IFACE_FLAG_PENDING, "pending");
    std::vector<pend_req> reqs(3);
    uint64_t n = fill_queue(reqs);
    ASSERT_FALSE(HasFailure());
    ASSERT_GT(n, 0u) << "nothing was sent before the queue was full";
    info(std::to_string(n) + " sends before UCS_ERR_NO_RESOURCE");
    for (auto &req : reqs) {
        EXPECT_EQ(0, req.sent) << "dispatched before any progress";
    }
    ASSERT_TRUE(wait_for([&] { return r.rx.size() == n + reqs.size(); }))
        << r.rx.size() << " of " << n + reqs.size() << " messages received";
    for (auto &req : reqs) {
        EXPECT_EQ(1, req.sent) << "request " << req.hdr;
    }
    expect_sequence(n + reqs.size());
}

/* Requests purged before the ep is destroyed are handed back, never sent */
TEST_P(am, pending_purge)
{
    require(UCT_IFACE_FLAG_PENDING, "pending");
    std::vector<pend_req> reqs(3);
    uint64_t n = fill_queue(reqs);
    ASSERT_FALSE(HasFailure());
    std::vector<uint64_t> purged;
    uct_ep_pending_purge(s.ep, [](uct_pending_req_t *self, void *arg) {
        static_cast<std::vector<uint64_t>*>(arg)->push_back(
            reinterpret_cast<pend_req*>(self)->hdr);
    }, &purged);
    EXPECT_EQ((std::vector<uint64_t>{n, n + 1, n + 2}), purged);
    ASSERT_TRUE(wait_for([&] { return r.rx.size() >= n; }));
    ASSERT_EQ(UCS_OK, flush_ep());
    uct_ep_destroy(s.ep);
    s.ep = nullptr;
    progress_for(1.0); /* would a purged request still go out? */
    for (auto &req : reqs) {
        EXPECT_EQ(0, req.calls) << "purged request " << req.hdr << " dispatched";
    }
    expect_sequence(n);
}

TEST_P(am, zcopy_remap_am)
{
    require(UCT_IFACE_FLAG_AM_ZCOPY, "am_zcopy");
    ASSERT_GE(s.attr.cap.am.max_hdr, sizeof(uint64_t));
    remap_case(am_max(ZCOPY), [&](char *p, uct_mem_h memh, size_t n) {
        return am_roundtrip(ZCOPY, p, n, memh);
    });
}

INSTANTIATE_TEST_SUITE_P(kreg, am, ::testing::Values("rc_kreg", "ud_kreg"),
                         [](const auto &info) { return info.param; });

} // namespace

int main(int argc, char **argv)
{
    ::testing::InitGoogleTest(&argc, argv);
    const char *device = (argc > 1) ? argv[1] : nullptr;
    if (GTEST_FLAG_GET(list_tests)) {
        return RUN_ALL_TESTS();
    }

    ucs_status_t st = kreg_ib_regcache_status();
    if (st != UCS_OK) {
        std::printf("skip: the ib_regcache component is not registered (%s)\n",
                    ucs_status_string(st));
        return 77;
    }

    g_component = find_component("ib_regcache", g_md_name, device);
    if (!g_component) {
        std::printf("skip: no ib_regcache md resource%s%s (no verbs device)\n",
                    device ? " named " : "", device ? device : "");
        return 77;
    }

    std::printf("info: md %s of ib_regcache; not applicable to ud_kreg (no "
                "RMA): put_short put_bcopy put_zcopy get_bcopy get_zcopy "
                "zcopy_remap_put\n", g_md_name.c_str());
    return RUN_ALL_TESTS();
}
