/* memtrim.h: hands back to the system the memory the allocator holds but
 * nothing uses.
 *
 * glibc keeps what a thread frees in its arena, resident, for the next
 * allocation; a node with many members churns ZeroMQ's per-connection
 * buffers, update buffers and a run's loading scratch, all of which stays
 * resident (docs/models-and-data.md#memory-per-node). malloc_trim(3) gives those
 * pages back (they come back zeroed on the next touch). Safe from any
 * thread; without glibc both calls do nothing. */
#ifndef TD_MEMTRIM_H
#define TD_MEMTRIM_H

/* Seconds between two trims of a node with no run (or a run of a model of
 * at most TD_MEMTRIM_SMALL_MODEL bytes), and of one training a larger model:
 * a trim costs a training node the page faults of touching again the
 * buffers each round frees and allocates, about the model's size each, an
 * idle one nothing (bench/RESULTS.md#topologies-at-scale). */
#define TD_MEMTRIM_IDLE_S 2.0
#define TD_MEMTRIM_BUSY_S 30.0
#define TD_MEMTRIM_SMALL_MODEL ((size_t)1 << 20)

/* Trims when period_s seconds of the monotonic clock have passed since the
 * last trim (the first call trims). */
void td_memtrim_tick(double period_s);

/* Trims now, e.g. once a large scratch was freed. */
void td_memtrim_now(void);

#endif
