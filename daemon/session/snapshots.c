/* snapshots.c: where a received SnapshotRequest or SnapshotChunk goes.
 *
 * Four parts move blobs through the same two messages: late join (join.c
 * serves the anchor a joiner asks for), anchor reconciliation (reconcile.c),
 * the repair of a node whose state differs (verify.c) and knowledge transfer
 * (transfer.c, which also carries the other three's bytes). This router sits above all three, so that transfer.c, which they
 * use, never calls them back by name. Loop thread. */
#include "daemon/session/shared.h"

void td__on_snapshot_request(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                             size_t bytes) {
  (void)bytes;
  const Traind__SnapshotRequest *rq = env->snapshot_request;
  td__session_t *s = td__session_of(n, env->run_id);
  size_t mi = s != NULL ? td__session_member(s, env->sender) : TD_MEMBERS_MAX;
  bool member = mi != TD_MEMBERS_MAX && !s->out[mi]; /* one put out is served nothing */
  if (rq->reconcile) {
    if (l == NULL || !member)
      td__drop(&n->drops, TD__DROP_WRONG_RUN, "reconciliation request for a round we do not hold");
    else
      td__reconcile_request(s, l, rq);
    return;
  }
  if (rq->repair) {
    if (l == NULL || !member)
      td__drop(&n->drops, TD__DROP_WRONG_RUN, "state request for a round we do not hold");
    else
      td__verify_request(s, l, rq);
    return;
  }
  if (l != NULL && member && rq->join) {
    td__join_request(s, l, env->sender, rq);
    return;
  }
  td__xfer_on_request(s, member, rq, l, &n->drops);
}

void td__on_snapshot_chunk(td__node_t *n, const Traind__Envelope *env, td__link_t *l,
                           size_t bytes) {
  (void)l;
  (void)bytes;
  const Traind__SnapshotChunk *ch = env->snapshot_chunk;
  /* frees the sender's window, whatever becomes of the chunk */
  td__link_send_ack(n->net, env->sender, env->run_id, TD__ACK_CHUNK, env->seq, ch->payload.len);
  td__session_t *s = td__session_of(n, env->run_id);
  if (ch->reconcile) {
    if (s == NULL)
      td__drop(&n->drops, TD__DROP_WRONG_RUN, "reconciliation chunk outside our run");
    else
      td__reconcile_chunk(s, env);
    return;
  }
  if (ch->repair) {
    if (s == NULL)
      td__drop(&n->drops, TD__DROP_WRONG_RUN, "state chunk outside our run");
    else
      td__verify_chunk(s, env->sender, ch);
    return;
  }
  td__xfer_on_chunk(s, env->sender, ch, &n->drops);
}
