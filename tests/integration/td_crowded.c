/* td_crowded.c: the crowded node of tests/integration/traind_crowded, a traind
 * linked from the same library with `-Wl,--wrap=td_members_open`, so that the
 * product's code holds no hook: its membership table starts with placeholder
 * members (ids that no key has, an address nobody listens on) until only
 * TD_CROWDED_ROOM entries (default 1) are left of TD_MEMBERS_MAX. The table is
 * the product's own, so a join past the limit meets the real refusal without
 * 257 processes; cluster_full.sh drives it. The placeholders fall silent and
 * are marked dead like any silent peer; nobody dials them (no link).
 * TD_CROWDED_SILENT_S (default 0) backdates their last word by that many
 * seconds: past TD_MEMBERS_EVICT_AFTER_S they are "dead long ago" from the
 * first heartbeat on, and a new node takes one's slot. */
#include <stdint.h>
#include <stdlib.h>

#include "daemon/base/clock.h"
#include "daemon/base/members.h"

/* The library's own function, which the linker renamed for this program. */
int __real_td_members_open(td_members_t **out, uint64_t self_id, const char *self_endpoint,
                           double suspect_after_s, double dead_after_s);
int __wrap_td_members_open(td_members_t **out, uint64_t self_id, const char *self_endpoint,
                           double suspect_after_s, double dead_after_s);

int __wrap_td_members_open(td_members_t **out, uint64_t self_id, const char *self_endpoint,
                           double suspect_after_s, double dead_after_s) {
  int rc = __real_td_members_open(out, self_id, self_endpoint, suspect_after_s, dead_after_s);
  if (rc != 0)
    return rc;
  const char *room_text = getenv("TD_CROWDED_ROOM");
  long room = room_text != NULL ? strtol(room_text, NULL, 10) : 1;
  if (room < 0 || room >= TD_MEMBERS_MAX)
    room = 1;
  const char *silent_text = getenv("TD_CROWDED_SILENT_S");
  double silent_s = silent_text != NULL ? strtod(silent_text, NULL) : 0;
  if (!(silent_s >= 0 && silent_s < 1e7))
    silent_s = 0;
  double now = td_clock_mono_s() - silent_s;
  for (uint64_t id = UINT64_C(0xfa11000000000001);
       td_members_count(*out) < (size_t)(TD_MEMBERS_MAX - room); id++)
    td_members_learn(*out, id, "tcp://127.0.0.1:9", now);
  return 0;
}
