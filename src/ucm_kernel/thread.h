/* The library's own threads (the readers and the dispatcher): how they
 * start. */
#ifndef UCX_KREG_THREAD_H
#define UCX_KREG_THREAD_H

#include <pthread.h>

namespace kreg {

/* Starts fn(arg) in a new thread named name, with every signal blocked (no
 * signal may interrupt or kill a reader: every thread blocked in munmap of
 * a watched range depends on it, the reader lifetime hazard), and returns
 * once the thread runs fn. 0, or pthread_create's error. */
int start_thread(pthread_t *thread, void *(*fn)(void *), void *arg,
                 const char *name);

} // namespace kreg

#endif
