/* UCX 1.13's registration method lists (REG_METHODS) and the stock "ib"
 * md's policy next to this library: reg_methods.c, used by ucx_1_13.c. */
#ifndef UCX_KREG_REG_METHODS_H
#define UCX_KREG_REG_METHODS_H

#include <stddef.h>

/* replace: `methods` with `drop` removed and, when `with` is not NULL,
 * `with` in its place; no method twice. Returns 1 if `drop` was in the list.
 * append: `name` at the end of `out` unless it is there already. */
int kreg_methods_replace(const char *methods, const char *drop,
                         const char *with, char *out, size_t max);
void kreg_methods_append(char *out, size_t max, const char *name);
int kreg_methods_has(const char *methods, const char *name);

/* The registration methods UCX's stock "ib" md is opened with while this
 * library is loaded (into out); logs why, once. */
void kreg_stock_reg_methods(const char *md_name, const char *configured,
                            char *out, size_t max);

#endif
