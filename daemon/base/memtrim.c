/* memtrim.c: free memory handed back to the system (memtrim.h). */
#include "daemon/base/memtrim.h"

#include <stdatomic.h>
#include <stdlib.h> /* defines __GLIBC__ on glibc */

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "daemon/base/clock.h"

/* monotonic seconds of the last trim (any thread) */
static _Atomic double last_trim = -1e300;

void td_memtrim_now(void) {
  atomic_store(&last_trim, td_clock_mono_s());
#ifdef __GLIBC__
  (void)malloc_trim(0);
#endif
}

void td_memtrim_tick(double period_s) {
  double now = td_clock_mono_s(), last = atomic_load(&last_trim);
  if (now - last >= period_s &&
      atomic_compare_exchange_strong(&last_trim, &last, now)) {
#ifdef __GLIBC__
    (void)malloc_trim(0);
#endif
  }
}
