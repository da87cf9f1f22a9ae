/* relay.c: frames relayed between nodes that accept no connections.
 *
 * Two nodes started with --listen none cannot dial each other, so a frame
 * from one (the origin) to the other (the target) goes through a reachable
 * member both are connected to (transport.c picks it and forwards). CURVE
 * authenticates each hop, not the origin, so the origin signs what it hands
 * the relay: Ed25519 with its signing key (admission.h) over
 * BLAKE2b-256("traind-relay2" | origin | target | seq | inner). The relay can
 * delay or drop a frame, not alter or invent one.
 *
 * Nor can it replay one: seq rises by one with every frame the origin relays
 * (to any target), starting from the origin's wall clock in microseconds when
 * it opened, so a restarted origin continues above what it sent before (it
 * would have to have relayed more than a million frames a second). The
 * target keeps, per origin, the newest seq it took and a bitmap of the
 * TD__RELAY_WINDOW before it: a seq taken before, or older than the window,
 * is refused. Frames may arrive out of order (the origin's control and bulk
 * connections to the relay are two streams), which the window absorbs. The
 * memory is fixed (one window per origin, TD_MEMBERS_MAX of them, reused
 * least recently used first) and only a frame whose signature holds touches
 * it, so nothing a remote sends makes it grow. What the window cannot know:
 * frames signed for this node before it restarted start a fresh window; the
 * inner messages' own run and round checks still apply to those.
 *
 * Loop thread only; the transport owns one of these. */
#include "daemon/net/relay.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/base/clock.h"
#include "daemon/base/members.h"

#define WINDOW_WORDS (TD__RELAY_WINDOW / 64)

/* What one origin's frames to this node have used. */
typedef struct {
  uint64_t origin; /* 0: a free slot */
  uint64_t top;    /* the newest seq taken */
  uint64_t used;   /* when it last took one (a tick of the table) */
  uint64_t seen[WINDOW_WORDS]; /* seq s taken: bit s % TD__RELAY_WINDOW, for top - s < window */
} window_t;

struct td__relays {
  uint64_t next_seq; /* ours */
  uint64_t ticks;
  window_t windows[TD_MEMBERS_MAX];
};

int td__relays_open(td__relays_t **out) {
  td__relays_t *r = calloc(1, sizeof *r);
  if (r == NULL)
    return TD_ENOMEM;
  double us = td_clock_wall_s() * 1e6;
  r->next_seq = us > 1 ? (uint64_t)us : 1;
  *out = r;
  return 0;
}

void td__relays_close(td__relays_t **self_p) {
  free(*self_p);
  *self_p = NULL;
}

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8)
    p[i] = (uint8_t)v;
}

/* The digest a relayed frame's signature covers. */
static void relay_digest(uint64_t origin, uint64_t target, uint64_t seq, const uint8_t *inner,
                         size_t len, uint8_t out[crypto_generichash_BYTES]) {
  static const char label[] = "traind-relay2";
  uint8_t ids[24];
  put_u64(ids, origin);
  put_u64(ids + 8, target);
  put_u64(ids + 16, seq);
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, crypto_generichash_BYTES);
  crypto_generichash_update(&st, (const uint8_t *)label, sizeof label - 1);
  crypto_generichash_update(&st, ids, sizeof ids);
  crypto_generichash_update(&st, inner, len);
  crypto_generichash_final(&st, out, crypto_generichash_BYTES);
}

int td__relay_wrap(td__relays_t *r, const td__admission_t *adm, uint64_t origin, uint64_t target,
                   uint64_t env_seq, const uint8_t *frame, size_t len, uint8_t **out,
                   size_t *out_len) {
  uint8_t digest[crypto_generichash_BYTES], sig[TD__SIGNATURE_BYTES];
  uint64_t seq = r->next_seq++;
  relay_digest(origin, target, seq, frame, len, digest);
  td__admission_sign_message(adm, digest, sizeof digest, sig);
  Traind__Relay relay = TRAIND__RELAY__INIT;
  relay.origin = origin;
  relay.target = target;
  relay.seq = seq;
  relay.inner = (ProtobufCBinaryData){.len = len, .data = (uint8_t *)frame};
  relay.signature = (ProtobufCBinaryData){.len = sizeof sig, .data = sig};
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RELAY;
  env.relay = &relay;
  env.sender = origin;
  env.seq = env_seq;
  return td_wire_pack(&env, out, out_len) != 0 ? TD_EPROTO : 0;
}

/* The window of `origin`: its own, else a free slot, else the least recently
 * used one, started over. */
static window_t *window_of(td__relays_t *r, uint64_t origin) {
  window_t *w = &r->windows[0];
  for (size_t i = 0; i < TD_MEMBERS_MAX; i++) {
    if (r->windows[i].origin == origin)
      return &r->windows[i];
    if (w->origin != 0 && (r->windows[i].origin == 0 || r->windows[i].used < w->used))
      w = &r->windows[i];
  }
  *w = (window_t){.origin = origin};
  return w;
}

static bool seen(const window_t *w, uint64_t seq) {
  uint64_t bit = seq % TD__RELAY_WINDOW;
  return (w->seen[bit / 64] >> (bit % 64)) & 1u;
}

static void mark(window_t *w, uint64_t seq) {
  uint64_t bit = seq % TD__RELAY_WINDOW;
  w->seen[bit / 64] |= (uint64_t)1 << (bit % 64);
}

static void unmark(window_t *w, uint64_t seq) {
  uint64_t bit = seq % TD__RELAY_WINDOW;
  w->seen[bit / 64] &= ~((uint64_t)1 << (bit % 64));
}

/* Take `seq` for w's origin once: false for a seq taken before or one older
 * than the window. */
static bool take(window_t *w, uint64_t seq) {
  if (w->top == 0) { /* the first frame of this origin here */
    w->top = seq;
    mark(w, seq);
    return true;
  }
  if (seq > w->top) {
    if (seq - w->top >= TD__RELAY_WINDOW)
      memset(w->seen, 0, sizeof w->seen);
    else
      for (uint64_t s = w->top + 1; s < seq; s++)
        unmark(w, s); /* the slots the window slides over */
    w->top = seq;
    mark(w, seq);
    return true;
  }
  if (w->top - seq >= TD__RELAY_WINDOW || seen(w, seq))
    return false;
  mark(w, seq);
  return true;
}

td__relay_verdict_t td__relay_accept(td__relays_t *r, const Traind__Relay *relay,
                                     const uint8_t *sign) {
  if (sign == NULL)
    return TD__RELAY_OK; /* insecure: nobody's frames are checked */
  uint8_t digest[crypto_generichash_BYTES];
  relay_digest(relay->origin, relay->target, relay->seq, relay->inner.data, relay->inner.len,
               digest);
  if (relay->signature.len != TD__SIGNATURE_BYTES ||
      crypto_sign_verify_detached(relay->signature.data, digest, sizeof digest, sign) != 0)
    return TD__RELAY_FORGED;
  window_t *w = window_of(r, relay->origin);
  if (!take(w, relay->seq))
    return TD__RELAY_REPLAYED;
  w->used = ++r->ticks;
  return TD__RELAY_OK;
}
