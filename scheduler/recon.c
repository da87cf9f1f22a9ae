/* recon.c: anchor reconciliation, collecting every member's fp16 anchor.
 *
 * A slot per round in progress holds, per member, the message bytes received
 * so far (allocated on the first chunk, freed with the slot) and one exact
 * double sum of the decoded messages. Our own messages live in a small ring
 * of their own so a member that lost chunks can ask again after we reconciled.
 * A hub's mean (fp32) is held whole in its slot, checked when it completes and
 * decoded again when the round is taken. Under a robust rule
 * (td_recon_set_rule) each completed message is kept as it came and the
 * round's messages are combined by that rule when it is taken. Every size in
 * a chunk is checked before memory is touched. */
#include "scheduler/recon.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/codec.h"
#include "common/error.h"
#include "scheduler/aggregate.h"

/* td_recon_plan: a member may be the hub when its uplink is at least this
 * fraction of the best (near-equal members do not flip the choice between
 * views), and auto takes the hub only when its estimate is under this
 * fraction of the mesh's (a margin for the estimate's error). */
#define HUB_UPLINK_FRACTION 0.5
#define HUB_GAIN_FRACTION 0.8
/* auto: below this many members a hub saves nothing over the mesh. */
#define HUB_MIN_MEMBERS 3

typedef struct {
  uint8_t *buf; /* msg_bytes, allocated on the first chunk */
  uint64_t received;
  double last; /* when the message last grew (or was last asked again) */
} member_t;

typedef struct {
  bool used, own_in;
  uint64_t round;
  size_t self;       /* our member index (td_recon_own) */
  uint64_t expected; /* members waited for (bit = member index) */
  uint64_t done;     /* members whose message completed (counted or rejected) */
  uint64_t counted;  /* members in the sum */
  uint64_t want_mean; /* members that sent to us as their hub */
  double opened, own_at;
  double *sum; /* numel, exact */
  member_t m[TD_RECON_MAX_MEMBERS];
  /* a hub's mean: mean_hub is the member it comes from (TD_RECON_MESH: none yet) */
  size_t mean_hub;
  uint8_t *mean_buf; /* mean_bytes, allocated on the first chunk */
  uint64_t mean_received;
  unsigned mean_used, mean_expected;
  bool mean_in; /* complete and checked */
} slot_t;

/* Our last messages, kept for members that ask again after we reconciled: a
 * member can be behind us by the rounds of both slots and then some. */
#define OWN_HELD 4

typedef struct {
  uint64_t round; /* 0: empty */
  uint8_t *msg;
  size_t len;
} own_t;

struct td_recon {
  const td_layout_t *layout;
  size_t numel, msg_bytes, mean_bytes;
  td_link_codec_t *enc;   /* fp16: no residual, deterministic */
  td_link_codec_t *enc32; /* none (fp32): a hub's mean, exact */
  float *scratch;       /* numel: one decoded message */
  bool robust;          /* combine by rule, not by the mean; no hub's mean */
  td_agg_spec_t rule;
  slot_t slots[TD_RECON_SLOTS];
  own_t own[OWN_HELD];
  uint64_t max_taken;
};

int td_recon_open(td_recon_t **out, const td_layout_t *layout) {
  td_recon_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return TD_ENOMEM;
  td_codec_spec_t fp16 = {.id = TD_CODEC_FP16}, fp32 = {.id = TD_CODEC_NONE};
  c->layout = layout;
  c->numel = td_layout_numel(layout);
  c->msg_bytes = td_codec_message_size(&fp16, layout);
  c->mean_bytes = td_codec_message_size(&fp32, layout);
  c->scratch = malloc(c->numel * sizeof(float));
  int rc = c->scratch == NULL ? TD_ENOMEM : td_link_codec_open(&c->enc, &fp16, layout, 0, 0);
  if (rc == 0)
    rc = td_link_codec_open(&c->enc32, &fp32, layout, 0, 0);
  if (rc != 0) {
    td_recon_close(&c);
    return rc;
  }
  *out = c;
  return 0;
}

static void slot_free(slot_t *s) {
  for (size_t i = 0; i < TD_RECON_MAX_MEMBERS; i++)
    free(s->m[i].buf);
  free(s->sum);
  free(s->mean_buf);
  memset(s, 0, sizeof *s);
  s->mean_hub = TD_RECON_MESH;
}

void td_recon_close(td_recon_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_recon_t *c = *self_p;
  for (size_t i = 0; i < TD_RECON_SLOTS; i++)
    slot_free(&c->slots[i]);
  for (size_t i = 0; i < OWN_HELD; i++)
    free(c->own[i].msg);
  td_link_codec_close(&c->enc);
  td_link_codec_close(&c->enc32);
  free(c->scratch);
  free(c);
  *self_p = NULL;
}

size_t td_recon_message_bytes(const td_recon_t *c) { return c->msg_bytes; }
size_t td_recon_mean_bytes(const td_recon_t *c) { return c->mean_bytes; }

void td_recon_set_rule(td_recon_t *c, const td_agg_spec_t *rule) {
  c->robust = rule != NULL && (rule->kind != TD_AGG_MEAN || rule->norm_bound > 0);
  if (c->robust)
    c->rule = *rule;
}

bool td_recon_robust(const td_recon_t *c) { return c->robust; }

size_t td_recon_plan(const double *uplink, uint64_t expected, td_recon_via_t via,
                     size_t msg_bytes, double *hub_s) {
  if (hub_s != NULL)
    *hub_s = 0;
  double best = 0, slowest = INFINITY;
  unsigned k = 0;
  bool known = true;
  for (size_t i = 0; i < TD_RECON_MAX_MEMBERS; i++) {
    if (!(expected >> i & 1))
      continue;
    double u = isfinite(uplink[i]) && uplink[i] > 0 ? uplink[i] : 0;
    k++;
    known = known && u > 0;
    best = u > best ? u : best;
    slowest = u < slowest ? u : slowest;
  }
  if (via == TD_RECON_VIA_MESH || k < 2)
    return TD_RECON_MESH;
  size_t hub = 0;
  while (!(expected >> hub & 1) || !(uplink[hub] >= HUB_UPLINK_FRACTION * best || best == 0))
    hub++;
  if (!known)
    return via == TD_RECON_VIA_HUB ? hub : TD_RECON_MESH;
  double other = INFINITY; /* the slowest member sending to the hub */
  for (size_t i = 0; i < TD_RECON_MAX_MEMBERS; i++)
    if ((expected >> i & 1) && i != hub && uplink[i] < other)
      other = uplink[i];
  double m = (double)msg_bytes;
  double t_hub = m / other + 2.0 * (k - 1) * m / uplink[hub];
  double t_mesh = (k - 1) * m / slowest;
  if (hub_s != NULL)
    *hub_s = t_hub;
  if (via == TD_RECON_VIA_HUB || (k >= HUB_MIN_MEMBERS && t_hub < HUB_GAIN_FRACTION * t_mesh))
    return hub;
  return TD_RECON_MESH;
}

static slot_t *slot_find(td_recon_t *c, uint64_t round) {
  for (size_t i = 0; i < TD_RECON_SLOTS; i++)
    if (c->slots[i].used && c->slots[i].round == round)
      return &c->slots[i];
  return NULL;
}

static slot_t *slot_get(td_recon_t *c, uint64_t round, double now) {
  slot_t *s = slot_find(c, round);
  if (s != NULL)
    return s;
  for (size_t i = 0; i < TD_RECON_SLOTS; i++) {
    s = &c->slots[i];
    if (!s->used) {
      if ((s->sum = calloc(c->numel, sizeof *s->sum)) == NULL)
        return NULL;
      s->used = true;
      s->round = round;
      s->opened = now;
      s->mean_hub = TD_RECON_MESH;
      return s;
    }
  }
  return NULL;
}

/* Decode one message into the slot's sum; false when it is not a finite fp16
 * message of the layout. */
static bool add_message(td_recon_t *c, slot_t *s, const uint8_t *msg, size_t len, char *why,
                        size_t why_len) {
  unsigned codec = 0;
  if (td_codec_decode_message(c->layout, msg, len, c->scratch, &codec, why, why_len) != 0)
    return false;
  if (codec != TD_CODEC_FP16) {
    td_why(why, why_len, TD_EPROTO, "reconciliation message in codec %u, not fp16", codec);
    return false;
  }
  for (size_t i = 0; i < c->numel; i++)
    s->sum[i] += (double)c->scratch[i];
  return true;
}

int td_recon_own(td_recon_t *c, uint64_t round, const float *d, size_t self, uint64_t expected,
                 double now, const uint8_t **msg, size_t *len, char *why, size_t why_len) {
  if (self >= TD_RECON_MAX_MEMBERS || !(expected >> self & 1))
    return td_why(why, why_len, TD_EINVAL, "member %zu is not among those expected", self);
  slot_t *s = slot_get(c, round, now);
  if (s == NULL)
    return td_why(why, why_len, TD_ERANGE, "two reconciliations are still open");
  if (s->own_in)
    return td_why(why, why_len, TD_EINVAL, "round %llu already has our anchor",
                  (unsigned long long)round);
  const uint8_t *m;
  size_t n;
  int rc = td_link_codec_encode(c->enc, d, &m, &n);
  if (rc != 0)
    return td_why(why, why_len, rc, "our anchor holds NaN/Inf");
  own_t *o = &c->own[0]; /* the oldest (or an empty one) makes room */
  for (size_t i = 1; i < OWN_HELD; i++)
    if (c->own[i].round < o->round)
      o = &c->own[i];
  uint8_t *copy = realloc(o->msg, n);
  if (copy == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  memcpy(copy, m, n);
  *o = (own_t){.round = round, .msg = copy, .len = n};
  if (!add_message(c, s, copy, n, why, why_len))
    return TD_EPROTO; /* cannot happen for a finite d */
  s->own_in = true;
  s->self = self;
  s->own_at = now;
  s->expected = expected;
  s->done |= (uint64_t)1 << self;
  s->counted |= (uint64_t)1 << self;
  for (size_t i = 0; i < TD_RECON_MAX_MEMBERS; i++)
    s->m[i].last = s->m[i].last > 0 ? s->m[i].last : now;
  *msg = copy;
  *len = n;
  return 0;
}

bool td_recon_own_message(const td_recon_t *c, uint64_t round, const uint8_t **msg, size_t *len) {
  for (size_t i = 0; i < OWN_HELD; i++)
    if (round > 0 && c->own[i].round == round) {
      *msg = c->own[i].msg;
      *len = c->own[i].len;
      return true;
    }
  return false;
}

/* The slot a chunk for `round` goes into, opened if needed; NULL with *result
 * LATE (the round is reconciled) or AHEAD (no free slot). */
static slot_t *slot_for_chunk(td_recon_t *c, uint64_t round, double now,
                              td_recon_result_t *result) {
  slot_t *s = slot_find(c, round);
  if (s == NULL && round <= c->max_taken)
    *result = TD_RECON_LATE;
  else if (s == NULL && (s = slot_get(c, round, now)) == NULL)
    *result = TD_RECON_AHEAD;
  return s;
}

void td_recon_quiet(td_recon_t *c, uint64_t round, double now, double seconds) {
  slot_t *s = slot_find(c, round);
  if (s == NULL || !(seconds > 0))
    return;
  for (size_t i = 0; i < TD_RECON_MAX_MEMBERS; i++)
    if (s->m[i].last < now + seconds)
      s->m[i].last = now + seconds;
}

int td_recon_chunk(td_recon_t *c, uint64_t round, size_t member, uint64_t offset,
                   uint64_t total, const uint8_t *data, size_t len, bool to_hub, double now,
                   td_recon_result_t *result, char *why, size_t why_len) {
  if (member >= TD_RECON_MAX_MEMBERS || total != c->msg_bytes || len == 0 || offset > total ||
      len > total - offset)
    return td_why(why, why_len, TD_EPROTO,
                  "reconciliation chunk of %zu bytes at %llu of %llu (a message is %zu bytes)",
                  len, (unsigned long long)offset, (unsigned long long)total, c->msg_bytes);
  slot_t *s = slot_for_chunk(c, round, now, result);
  if (s == NULL)
    return 0;
  member_t *m = &s->m[member];
  if (to_hub)
    s->want_mean |= (uint64_t)1 << member;
  if ((s->done >> member & 1) || offset != m->received) {
    *result = TD_RECON_DUPLICATE;
    return 0;
  }
  if (m->buf == NULL && (m->buf = malloc(c->msg_bytes)) == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  memcpy(m->buf + offset, data, len);
  m->received += len;
  m->last = now;
  if (m->received < total) {
    *result = TD_RECON_ACCEPTED;
    return 0;
  }
  s->done |= (uint64_t)1 << member;
  bool ok = add_message(c, s, m->buf, (size_t)total, why, why_len);
  if (!ok || !c->robust) { /* under a rule it is combined when the round is taken */
    free(m->buf);
    m->buf = NULL;
  }
  if (ok)
    s->counted |= (uint64_t)1 << member;
  *result = ok ? TD_RECON_COMPLETED : TD_RECON_REJECTED;
  return 0;
}

int td_recon_mean_chunk(td_recon_t *c, uint64_t round, size_t hub, uint64_t offset,
                        uint64_t total, const uint8_t *data, size_t len, unsigned used,
                        unsigned expected, double now, td_recon_result_t *result, char *why,
                        size_t why_len) {
  if (hub >= TD_RECON_MAX_MEMBERS || total != c->mean_bytes || len == 0 || offset > total ||
      len > total - offset)
    return td_why(why, why_len, TD_EPROTO,
                  "reconciled mean chunk of %zu bytes at %llu of %llu (a mean is %zu bytes)", len,
                  (unsigned long long)offset, (unsigned long long)total, c->mean_bytes);
  if (c->robust) { /* one member's float would set every model: never on trust */
    *result = TD_RECON_REJECTED;
    td_why(why, why_len, TD_EPROTO, "a hub's mean is not taken under a robust aggregate");
    return 0;
  }
  slot_t *s = slot_for_chunk(c, round, now, result);
  if (s == NULL)
    return 0;
  /* one hub per round: another's chunks (members disagreed on it) are dropped */
  if (s->mean_in || (s->mean_hub != TD_RECON_MESH && s->mean_hub != hub) ||
      offset != s->mean_received) {
    *result = TD_RECON_DUPLICATE;
    return 0;
  }
  if (s->mean_buf == NULL && (s->mean_buf = malloc(c->mean_bytes)) == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  s->mean_hub = hub;
  memcpy(s->mean_buf + offset, data, len);
  s->mean_received += len;
  s->m[hub].last = s->m[hub].last > now ? s->m[hub].last : now;
  if (s->mean_received < total) {
    *result = TD_RECON_ACCEPTED;
    return 0;
  }
  unsigned codec = 0;
  bool ok = false;
  if (used < 1 || used > expected || expected > TD_RECON_MAX_MEMBERS) {
    td_why(why, why_len, TD_EPROTO, "reconciled mean of %u of %u anchors", used, expected);
  } else if (td_codec_decode_message(c->layout, s->mean_buf, c->mean_bytes, c->scratch, &codec,
                                     why, why_len) != 0) {
    /* why says what */
  } else if (codec != TD_CODEC_NONE) {
    td_why(why, why_len, TD_EPROTO, "reconciled mean in codec %u, not fp32", codec);
  } else {
    ok = true;
    for (size_t i = 0; ok && i < c->numel; i++)
      ok = isfinite(c->scratch[i]);
    if (!ok)
      td_why(why, why_len, TD_EPROTO, "reconciled mean holds NaN/Inf");
  }
  if (!ok) { /* forget it: the round completes by its own collection */
    free(s->mean_buf);
    s->mean_buf = NULL;
    s->mean_received = 0;
    s->mean_hub = TD_RECON_MESH;
    *result = TD_RECON_REJECTED;
    return 0;
  }
  s->mean_in = true;
  s->mean_used = used;
  s->mean_expected = expected;
  *result = TD_RECON_COMPLETED;
  return 0;
}

int td_recon_encode_mean(td_recon_t *c, const float *mean, const uint8_t **msg, size_t *len) {
  return td_link_codec_encode(c->enc32, mean, msg, len);
}

size_t td_recon_stalled(td_recon_t *c, double now, double after, td_recon_stall_t *out,
                        size_t cap) {
  size_t n = 0;
  for (size_t i = 0; i < TD_RECON_SLOTS; i++) {
    slot_t *s = &c->slots[i];
    if (!s->used || !s->own_in)
      continue;
    for (size_t j = 0; j < TD_RECON_MAX_MEMBERS && n < cap; j++) {
      bool waiting = (s->expected >> j & 1) && !(s->done >> j & 1);
      if (waiting && now - s->m[j].last >= after) {
        out[n++] = (td_recon_stall_t){.round = s->round, .member = j,
                                      .offset = s->m[j].received};
        s->m[j].last = now;
      }
    }
  }
  return n;
}

static unsigned popcount64(uint64_t x) {
  unsigned n = 0;
  for (; x; x &= x - 1)
    n++;
  return n;
}

/* The counted messages of s combined by the rule into out; *refused gets
 * the members the rule rejected. Every node that counted the same members
 * computes the same floats (td_agg_apply sorts by member index). Out of
 * memory: out is our own anchor as sent, nobody is combined (no move). */
static void combine(td_recon_t *c, slot_t *s, float *out, unsigned *used, uint64_t *refused) {
  unsigned k = popcount64(s->counted);
  float *dec = k > 0 ? malloc((size_t)k * c->numel * sizeof *dec) : NULL;
  td_agg_input_t *in = k > 0 ? calloc(k, sizeof *in) : NULL;
  const uint8_t *own = NULL;
  size_t own_len = 0;
  *refused = 0;
  if (dec == NULL || in == NULL || !td_recon_own_message(c, s->round, &own, &own_len)) {
    *used = 1;
    if (own == NULL || td_codec_decode_message(c->layout, own, own_len, out, NULL, NULL, 0) != 0)
      memset(out, 0, c->numel * sizeof *out); /* cannot happen: own_in holds it */
    free(dec);
    free(in);
    return;
  }
  size_t n = 0;
  for (size_t j = 0; j < TD_RECON_MAX_MEMBERS && n < k; j++) {
    if (!(s->counted >> j & 1))
      continue;
    const uint8_t *msg = j == s->self ? own : s->m[j].buf;
    size_t len = j == s->self ? own_len : c->msg_bytes;
    float *x = dec + n * c->numel;
    if (msg == NULL || td_codec_decode_message(c->layout, msg, len, x, NULL, NULL, 0) != 0)
      continue; /* checked when it completed: cannot happen */
    in[n++] = (td_agg_input_t){.id = j, .delta = x, .weight = 1};
  }
  *used = (unsigned)td_agg_apply(&c->rule, in, n, c->numel, out, NULL);
  for (size_t i = 0; i < n; i++)
    if (in[i].verdict == TD_AGG_REJECTED)
      *refused |= (uint64_t)1 << in[i].id;
  free(dec);
  free(in);
}

bool td_recon_take(td_recon_t *c, double now, double timeout, float *mean, td_recon_taken_t *t) {
  slot_t *best = NULL;
  for (size_t i = 0; i < TD_RECON_SLOTS; i++) {
    slot_t *s = &c->slots[i];
    if (!s->used)
      continue;
    if (!s->own_in) { /* peers' messages for a round we never reach: forget them */
      if (now - s->opened > 4 * timeout)
        slot_free(s);
      continue;
    }
    bool ready = s->mean_in || (s->done & s->expected) == s->expected ||
                 now - s->own_at >= timeout;
    if (ready && (best == NULL || s->round < best->round))
      best = s;
  }
  if (best == NULL)
    return false;
  *t = (td_recon_taken_t){.round = best->round, .hub = TD_RECON_MESH};
  unsigned codec;
  if (best->mean_in && td_codec_decode_message(c->layout, best->mean_buf, c->mean_bytes, mean,
                                               &codec, NULL, 0) == 0) {
    t->used = best->mean_used;
    t->expected = best->mean_expected;
    t->hub = best->mean_hub;
  } else if (c->robust) {
    combine(c, best, mean, &t->used, &t->refused);
    t->expected = popcount64(best->expected);
  } else {
    unsigned k = popcount64(best->counted);
    for (size_t i = 0; i < c->numel; i++)
      mean[i] = (float)(best->sum[i] / k);
    t->used = k;
    t->expected = popcount64(best->expected);
    t->want_mean = best->want_mean & best->counted;
  }
  if (best->round > c->max_taken)
    c->max_taken = best->round;
  slot_free(best);
  return true;
}
