# Applied to every file copied from UCX 1.13.1's test/gtest (Debian source,
# deps/ucx, never committed) into the build dir: instantiate UCX's tests for
# the ib_regcache component's md and transports next to the stock ones, and
# let UCX's name checks take our names for their stock twins.
#
# tl lists: rc_kreg after rc_verbs, ud_kreg after ud_verbs (uct_test.h's
# UCT_TEST_IB_TLS, which UCT_TEST_TLS and UCT_TEST_NO_SELF_TLS include)
s/^\(    rc_verbs,\)\( *\\\)$/\1 rc_kreg,\2/
s/^\(    ud_verbs,\)\( *\\\)$/\1 ud_kreg,\2/
# UCT_INSTANTIATE_RC_TEST_CASE (uct_test.h) and UCT_INSTANTIATE_UD_TEST_CASE
# (ud_base.h)
s/^\(    _UCT_INSTANTIATE_TEST_CASE(_test_case, \)\(rc\|ud\)_verbs) \\$/&\n\1\2_kreg) \\/
# test_md.cc's md list, test_ib_md.cc's instantiation
s/^\( *\)ib, \\$/&\n\1ib_regcache, \\/
s/^_UCT_MD_INSTANTIATE_TEST_CASE(test_ib_md, ib)$/&\n_UCT_MD_INSTANTIATE_TEST_CASE(test_ib_md, ib_regcache)/
# uct_test::has_transport("rc_verbs"/"ud_verbs") holds for rc_kreg/ud_kreg
s/^    return (GetParam()->tl_name == tl_name);$/    return (GetParam()->tl_name == tl_name) ||\
           ((tl_name == "rc_verbs") \&\& (GetParam()->tl_name == "rc_kreg")) ||\
           ((tl_name == "ud_verbs") \&\& (GetParam()->tl_name == "ud_kreg"));/
# test_flush.cc: tl_name != "rc_verbs"
s/^\( *\)(GetParam()->tl_name != "rc_verbs") \&\&$/&\n\1(GetParam()->tl_name != "rc_kreg") \&\&/
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
