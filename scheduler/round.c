/* round.c: windowed update collection.
 *
 * Each slot holds, per peer, the message bytes received so far, a map of the
 * chunks received, the decoded update (numel floats) and its metadata. Buffers
 * are allocated the first time a peer sends, so memory follows the real
 * number of peers. A slot is recycled when the round advances. Every size in a
 * chunk is checked before memory is touched. */
#include "scheduler/round.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/codec.h"
#include "common/error.h"

typedef struct {
  uint64_t peer;
  bool used, expected, complete;
  bool assembled; /* deferred: every chunk is in, the decoded update is not */
  uint64_t gen;   /* bumped whenever the entry is recycled (a ticket names one use) */
  uint64_t samples;
  uint32_t chunks, received;
  uint8_t *seen; /* one byte per chunk, max_chunks */
  uint64_t bytes, total;
  double loss;
  unsigned codec;
  uint8_t *msg;  /* total bytes, grown on demand */
  size_t msg_cap;
  float *data;   /* numel floats, allocated on first use */
} slot_entry_t;

typedef struct {
  uint64_t round;
  slot_entry_t e[TD_ROUND_MAX_PEERS];
} slot_t;

struct td_round {
  const td_layout_t *layout;
  size_t numel;
  uint64_t max_bytes;
  uint32_t max_chunks;
  unsigned n_slots;             /* the window: TD_ROUND_SLOTS, or more (td_round_open_window) */
  slot_t slots[];               /* [k] holds round t + k, k < n_slots */
};

uint32_t td_round_chunk_count(uint64_t total_bytes) {
  return td_chunk_count(total_bytes);
}

int td_round_open(td_round_t **out, const td_layout_t *layout) {
  return td_round_open_window(out, layout, TD_ROUND_SLOTS);
}

int td_round_open_window(td_round_t **out, const td_layout_t *layout, unsigned slots) {
  if (slots < 2 || slots > TD_ROUND_SLOTS_MAX)
    return TD_EINVAL;
  td_round_t *r = calloc(1, sizeof *r + slots * sizeof(slot_t));
  if (r == NULL)
    return TD_ENOMEM;
  r->n_slots = slots;
  r->layout = layout;
  r->numel = td_layout_numel(layout);
  r->max_bytes = td_codec_message_bound(layout);
  r->max_chunks = td_round_chunk_count(r->max_bytes);
  for (unsigned s = 0; s < r->n_slots; s++)
    r->slots[s].round = (uint64_t)s;
  *out = r;
  return 0;
}

void td_round_close(td_round_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  td_round_t *r = *self_p;
  for (unsigned s = 0; s < r->n_slots; s++)
    for (int i = 0; i < TD_ROUND_MAX_PEERS; i++) {
      free(r->slots[s].e[i].data);
      free(r->slots[s].e[i].seen);
      free(r->slots[s].e[i].msg);
    }
  free(r);
  *self_p = NULL;
}

/* An entry of a round that left the window: its decoded update goes too
 * (td_round_begin runs only once that round's aggregation is done), so the
 * buffers held follow the entries in use, not the 16 slots. */
static void clear_entry(td_round_t *r, slot_entry_t *e) {
  td_params_free(&e->data);
  e->used = e->expected = e->complete = e->assembled = false;
  e->gen++;
  e->peer = e->samples = e->bytes = e->total = 0;
  e->chunks = e->received = 0;
  e->loss = 0;
  e->codec = 0;
  if (e->seen != NULL)
    memset(e->seen, 0, r->max_chunks + 1);
}

static slot_entry_t *find(slot_t *s, uint64_t peer) {
  for (int i = 0; i < TD_ROUND_MAX_PEERS; i++)
    if (s->e[i].used && s->e[i].peer == peer)
      return &s->e[i];
  return NULL;
}

static slot_entry_t *find_or_add(slot_t *s, uint64_t peer) {
  slot_entry_t *e = find(s, peer);
  if (e != NULL)
    return e;
  for (int i = 0; i < TD_ROUND_MAX_PEERS; i++)
    if (!s->e[i].used) {
      s->e[i].used = true;
      s->e[i].peer = peer;
      return &s->e[i];
    }
  return NULL;
}

void td_round_begin(td_round_t *r, uint64_t round, const uint64_t *peers, size_t n_peers) {
  uint64_t t = r->slots[0].round;
  unsigned n = r->n_slots;
  if (round > t && round - t < n) {
    /* advance by d: slots t+d.. become current, keep what they buffered, and
     * recycle the d slots that fall out of the window at its far end */
    unsigned d = (unsigned)(round - t);
    slot_t old[TD_ROUND_SLOTS_MAX];
    memcpy(old, r->slots, n * sizeof old[0]);
    for (unsigned k = 0; k < n; k++)
      r->slots[k] = old[(k + d) % n];
    for (unsigned k = n - d; k < n; k++)
      for (int i = 0; i < TD_ROUND_MAX_PEERS; i++)
        clear_entry(r, &r->slots[k].e[i]);
  } else if (round != t) {
    for (unsigned k = 0; k < n; k++)
      for (int i = 0; i < TD_ROUND_MAX_PEERS; i++)
        clear_entry(r, &r->slots[k].e[i]);
  }
  for (unsigned k = 0; k < n; k++)
    r->slots[k].round = round + k;
  for (int i = 0; i < TD_ROUND_MAX_PEERS; i++)
    r->slots[0].e[i].expected = false;
  for (size_t i = 0; i < n_peers; i++) {
    slot_entry_t *e = find_or_add(&r->slots[0], peers[i]);
    if (e != NULL)
      e->expected = true;
  }
}

uint64_t td_round_current(const td_round_t *r) { return r->slots[0].round; }

int td_round_add_chunk(td_round_t *r, uint64_t peer, uint64_t round, uint64_t samples,
                       uint32_t chunk, uint32_t chunks, uint64_t total_bytes,
                       const uint8_t *payload, size_t len, double loss,
                       td_chunk_result_t *result, td_update_info_t *info) {
  if (total_bytes == 0 || total_bytes > r->max_bytes ||
      chunks != td_round_chunk_count(total_bytes) || chunk >= chunks)
    return TD_EPROTO;
  uint64_t offset = (uint64_t)chunk * TD_ROUND_CHUNK_BYTES;
  uint64_t expect_len = chunk + 1 < chunks ? TD_ROUND_CHUNK_BYTES : total_bytes - offset;
  if (len != expect_len)
    return TD_EPROTO;
  if (round < r->slots[0].round) {
    *result = TD_CHUNK_LATE;
    return 0;
  }
  if (round - r->slots[0].round >= r->n_slots) {
    *result = TD_CHUNK_AHEAD;
    return 0;
  }
  slot_t *s = &r->slots[round - r->slots[0].round];
  slot_entry_t *e = find_or_add(s, peer);
  if (e == NULL) {
    *result = TD_CHUNK_AHEAD; /* table full: treat as unusable */
    return 0;
  }
  if (e->complete || e->assembled || (e->seen != NULL && e->seen[chunk])) {
    *result = TD_CHUNK_DUPLICATE;
    return 0;
  }
  if (e->received == 0) {
    if (e->seen == NULL && (e->seen = calloc(r->max_chunks + 1, 1)) == NULL)
      return TD_ENOMEM;
    if (e->msg_cap < total_bytes) {
      uint8_t *m = realloc(e->msg, total_bytes);
      if (m == NULL)
        return TD_ENOMEM;
      e->msg = m;
      e->msg_cap = total_bytes;
    }
    e->samples = samples;
    e->chunks = chunks;
    e->total = total_bytes;
    e->loss = loss;
  } else if (e->samples != samples || e->total != total_bytes) {
    return TD_EPROTO;
  }
  memcpy(e->msg + offset, payload, len);
  e->seen[chunk] = 1;
  e->received++;
  e->bytes += len;
  *result = TD_CHUNK_ACCEPTED;
  if (e->received < e->chunks)
    return 0;
  e->assembled = true;
  *result = TD_CHUNK_ASSEMBLED;
  if (info != NULL)
    *info = (td_update_info_t){.peer = peer, .round = round, .samples = e->samples,
                               .bytes = e->bytes, .loss = e->loss};
  return 0;
}
size_t td_round_numel(const td_round_t *r) { return r->numel; }

static slot_entry_t *entry_of(td_round_t *r, uint64_t round, uint64_t peer) {
  if (round < r->slots[0].round || round - r->slots[0].round >= r->n_slots)
    return NULL;
  return find(&r->slots[round - r->slots[0].round], peer);
}

int td_round_take_message(td_round_t *r, uint64_t round, uint64_t peer, uint8_t **msg,
                          size_t *len, uint64_t *ticket) {
  slot_entry_t *e = entry_of(r, round, peer);
  if (e == NULL || !e->assembled || e->msg == NULL)
    return TD_EINVAL;
  *msg = e->msg; /* the entry gets a new buffer if it is used again */
  *len = (size_t)e->total;
  *ticket = e->gen;
  e->msg = NULL;
  e->msg_cap = 0;
  return 0;
}

void td_round_put_decoded(td_round_t *r, uint64_t round, uint64_t peer, uint64_t ticket,
                          float **data, unsigned codec, bool ok, td_chunk_result_t *result,
                          td_update_info_t *info) {
  slot_entry_t *e = entry_of(r, round, peer);
  if (e == NULL || e->gen != ticket || !e->assembled) {
    td_params_free(data);
    *result = TD_CHUNK_LATE;
    return;
  }
  e->assembled = false;
  e->complete = true;
  e->codec = codec;
  if (ok && *data != NULL) {
    td_params_free(&e->data);
    e->data = *data;
    *data = NULL;
    *result = TD_CHUNK_COMPLETED;
  } else {
    td_params_free(data);
    e->samples = 0; /* never aggregated */
    *result = TD_CHUNK_REJECTED;
  }
  if (info != NULL)
    *info = (td_update_info_t){.peer = peer, .round = round, .samples = e->samples,
                               .bytes = e->bytes, .loss = e->loss, .codec = e->codec};
}

void td_round_forget_peer(td_round_t *r, uint64_t peer) {
  slot_entry_t *e = find(&r->slots[0], peer);
  if (e != NULL)
    e->expected = false;
}

td_round_peer_state_t td_round_peer_state(const td_round_t *r, uint64_t peer) {
  for (int i = 0; i < TD_ROUND_MAX_PEERS; i++) {
    const slot_entry_t *e = &r->slots[0].e[i];
    if (!e->used || e->peer != peer)
      continue;
    if (e->assembled)
      return TD_PEER_DECODING;
    if (e->complete)
      return e->data != NULL ? TD_PEER_HAVE : TD_PEER_REFUSED;
    return e->received > 0 ? TD_PEER_PARTIAL : TD_PEER_NONE;
  }
  return TD_PEER_NONE;
}

bool td_round_restart_peer(td_round_t *r, uint64_t peer) {
  slot_entry_t *e = find(&r->slots[0], peer);
  if (e == NULL)
    return true;
  if ((e->complete && e->data != NULL) || e->assembled)
    return false;
  e->complete = false;
  e->samples = e->bytes = e->total = 0;
  e->chunks = e->received = 0;
  e->loss = 0;
  e->codec = 0;
  if (e->seen != NULL)
    memset(e->seen, 0, r->max_chunks + 1);
  return true;
}

bool td_round_refuse_peer(td_round_t *r, uint64_t peer) {
  slot_entry_t *e = find(&r->slots[0], peer);
  if (e == NULL || !e->complete || e->data == NULL || e->assembled)
    return false;
  td_params_free(&e->data);
  e->samples = 0; /* never aggregated, as a message that did not decode */
  return true;
}

bool td_round_complete(const td_round_t *r) {
  for (int i = 0; i < TD_ROUND_MAX_PEERS; i++) {
    const slot_entry_t *e = &r->slots[0].e[i];
    if (e->used && e->expected && !e->complete)
      return false;
  }
  return true;
}

size_t td_round_missing(const td_round_t *r, uint64_t *peers, size_t cap) {
  size_t n = 0;
  for (int i = 0; i < TD_ROUND_MAX_PEERS && n < cap; i++) {
    const slot_entry_t *e = &r->slots[0].e[i];
    if (e->used && e->expected && !e->complete)
      peers[n++] = e->peer;
  }
  return n;
}

bool td_round_moved_on(const td_round_t *r) {
  for (int i = 0; i < TD_ROUND_MAX_PEERS; i++)
    if (r->slots[1].e[i].used)
      return true;
  return false;
}

size_t td_round_received(const td_round_t *r) {
  size_t n = 0;
  for (int i = 0; i < TD_ROUND_MAX_PEERS; i++) {
    const slot_entry_t *e = &r->slots[0].e[i];
    n += e->used && e->complete && e->samples > 0;
  }
  return n;
}

size_t td_round_collect(const td_round_t *r, td_agg_input_t *out, size_t cap) {
  size_t n = 0;
  for (int i = 0; i < TD_ROUND_MAX_PEERS && n < cap; i++) {
    const slot_entry_t *e = &r->slots[0].e[i];
    if (e->used && e->complete && e->samples > 0)
      out[n++] = (td_agg_input_t){.id = e->peer, .delta = e->data, .weight = (double)e->samples};
  }
  return n;
}
