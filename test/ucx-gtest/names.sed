# Applied to every file copied from UCX's test/gtest (1.13.1: Debian source,
# deps/ucx; 1.22.0: the release tree next to --with-ucx's PREFIX; never
# committed) into the build dir: instantiate UCX's tests for the ib_regcache
# component's md and transports next to the stock ones, and let UCX's name
# checks take our names for their stock twins. One file for both versions: a
# rule whose line is not in one version's files changes nothing there.
#
# tl lists: rc_kreg after rc_verbs, ud_kreg after ud_verbs (uct_test.h's
# UCT_TEST_IB_TLS, which UCT_TEST_TLS and UCT_TEST_NO_SELF_TLS include)
s/^\(    rc_verbs,\)\( *\\\)$/\1 rc_kreg,\2/
s/^\(    ud_verbs,\)\( *\\\)$/\1 ud_kreg,\2/
# UCT_INSTANTIATE_TEST_CASE (uct_test.h): UCS_PP_FOREACH takes at most
# UCS_PP_MAX_ARGS names (1.13: 20, 1.22: 21), and 1.22's UCT_TEST_TLS has 21
# without ours: iterate over its parts (UCT_TEST_TLS is, in both, exactly
# UCT_TEST_NO_GPU_MEM_TYPE_TLS, UCT_TEST_ROCM_MEM_TYPE_TLS,
# UCT_TEST_CUDA_MEM_TYPE_TLS) in two calls, the same instantiations in order
s/^\(    UCS_PP_FOREACH(_UCT_INSTANTIATE_TEST_CASE, _test_case, \)UCT_TEST_TLS)$/\1UCT_TEST_NO_GPU_MEM_TYPE_TLS) \\\
\1UCT_TEST_ROCM_MEM_TYPE_TLS, UCT_TEST_CUDA_MEM_TYPE_TLS)/
# UCT_INSTANTIATE_RC_TEST_CASE (uct_test.h) and UCT_INSTANTIATE_UD_TEST_CASE
# (ud_base.h)
s/^\(    _UCT_INSTANTIATE_TEST_CASE(_test_case, \)\(rc\|ud\)_verbs) \\$/&\n\1\2_kreg) \\/
# test_md.cc's md list, test_ib_md.cc's instantiation
s/^\( *\)ib, \\$/&\n\1ib_regcache, \\/
# (1.22 also has test_ib_md_non_blocking)
s/^_UCT_MD_INSTANTIATE_TEST_CASE(\(test_ib_md[a-z_]*\), ib)$/&\n_UCT_MD_INSTANTIATE_TEST_CASE(\1, ib_regcache)/
# uct_test::has_transport("rc_verbs"/"ud_verbs") holds for rc_kreg/ud_kreg
s/^    return (GetParam()->tl_name == tl_name);$/    return (GetParam()->tl_name == tl_name) ||\
           ((tl_name == "rc_verbs") \&\& (GetParam()->tl_name == "rc_kreg")) ||\
           ((tl_name == "ud_verbs") \&\& (GetParam()->tl_name == "ud_kreg"));/
# test_flush.cc: tl_name != "rc_verbs"
s/^\( *\)(GetParam()->tl_name != "rc_verbs") \&\&$/&\n\1(GetParam()->tl_name != "rc_kreg") \&\&/
# test_flush.cc (1.22): check_skip_test_flush_remote skips the IB md without
# mlx5 PRM/KSM (the component's md is UCX's IB md object too)
s/^\( *\)if (std::string(md->component->name) == "ib") {$/\1if ((std::string(md->component->name) == "ib") ||\
\1    (std::string(md->component->name) == "ib_regcache")) {/
# test_rc.cc (1.22): test_rc_iface_flush_remote's address sizes per tl
s/^\( *\){"rc_verbs", \(.*\)},$/&\n\1{"rc_kreg", \2},/
# test_md.cc (1.22): test_md::is_bf_arm (aarch64) looks into the IB md
s/^\( *\)(std::string("ib") == md_attr().component_name)) {$/\1((std::string("ib") == md_attr().component_name) ||\
\1 (std::string("ib_regcache") == md_attr().component_name))) {/
# test_md.cc: real sys device on IB components
s/^\( *\)if (!strcmp(md_attr().component_name, "ib")) {$/\1if (!strcmp(md_attr().component_name, "ib") ||\n\1    !strcmp(md_attr().component_name, "ib_regcache")) {/
# test_md::modify_config: the component's md config embeds UCX's IB md table
# under "IB_" (UCX_IB_<NAME>, then UCX_IB_REGCACHE_<NAME>), so for
# uct_config_modify() the stock md's REG_METHODS is IB_REG_METHODS there
s/^    ucs_status_t status = uct_config_modify(m_md_config, name.c_str(), value.c_str());$/&\
    uct_component_attr_t kreg_cmpt_attr;\
    kreg_cmpt_attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;\
    if ((status == UCS_ERR_NO_ELEM) \&\&\
        (uct_component_query(GetParam().component, \&kreg_cmpt_attr) == UCS_OK) \&\&\
        !strcmp(kreg_cmpt_attr.name, "ib_regcache")) {\
        status = uct_config_modify(m_md_config, ("IB_" + name).c_str(), value.c_str());\
    }/
# the same in uct_test::modify_config (the entities' md config: GID_INDEX,
# REG_METHODS, REG_MT_THRESH, INDIRECT_ATOMIC, MLX5_DEVX, ...)
s/^        status = uct_config_modify(m_md_config, name.c_str(), value.c_str());$/&\
        if ((status == UCS_ERR_NO_ELEM) \&\&\
            (GetParam()->component_name == "ib_regcache")) {\
            status = uct_config_modify(m_md_config, ("IB_" + name).c_str(),\
                                       value.c_str());\
        }/
