/* td_mkledger.c: writes a node ledger with three known runs, through the
 * daemon's own ledger API (daemon/store/ledger.h, real SQLite), for the history and
 * plot tests (history_cli.sh).
 *
 *   td_mkledger PATH NODE [NODES]
 *
 * Runs (ids chosen so that "ab" is an ambiguous prefix and the third id has
 * the sign bit set, as half of all real ids do):
 *   ab12000000000001  mode=sync    codec=none           12 rounds
 *   ab34000000000002  mode=overlap codec=topk:0.01      12 rounds
 *   cd56000000000003  mode=overlap codec=none, seed=7   8 rounds, no updates
 * NODE (0, 1, ...) shifts the numbers a little, so that the ledgers of two
 * "nodes" of the same runs differ. Every round has loss, bytes, compute and
 * wait seconds; every second round an evaluation; runs 1-2 have two updates
 * and one link measurement per round; events mark each run's start and end.
 * NODES (default 2) is the size of the cluster the runs had: the run_start
 * events say "rank NODE of NODES", and every round sends (NODES - 1) times
 * the bytes, as a mesh does. Given, it also puts NODES << 40 into the run ids
 * (ab12000000000001 becomes ab12060000000001 for 6), so that the runs of a
 * cluster of another size are other runs, and lists NODES members in every
 * round's row. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/ledger.h"
#include "daemon/run/runspec.h"

static int fail(const char *what) {
  fprintf(stderr, "td_mkledger: %s failed\n", what);
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 3 && argc != 4) {
    fprintf(stderr, "usage: td_mkledger PATH NODE [NODES]\n");
    return 2;
  }
  int node = atoi(argv[2]);
  int nodes = argc == 4 ? atoi(argv[3]) : 2;
  if (nodes < 2 || nodes > 64 || node < 0 || node >= nodes) {
    fprintf(stderr, "td_mkledger: NODES in [2, 64], NODE in [0, NODES)\n");
    return 2;
  }
  uint64_t id_mark = argc == 4 ? (uint64_t)nodes << 40 : 0;
  char members[64 * 17] = "";
  for (int m = 0; argc == 4 && m < nodes; m++)
    snprintf(members + strlen(members), sizeof members - strlen(members), "%s%016llx",
             m ? "," : "", 0xfeed0000ull + (unsigned long long)m);
  char why[256];
  td_ledger_t *l;
  if (td_ledger_open(&l, argv[1], why, sizeof why) != 0) {
    fprintf(stderr, "td_mkledger: %s\n", why);
    return 1;
  }
  static const struct {
    uint64_t id;
    const char *sets[4];
    unsigned rounds;
    bool updates;
  } runs[] = {
      {0xab12000000000001ull, {"mode=sync", "codec=none", NULL}, 12, true},
      {0xab34000000000002ull, {"mode=overlap", "codec=topk:0.01", NULL}, 12, true},
      {0xcd56000000000003ull, {"mode=overlap", "codec=none", "seed=7", NULL}, 8, false},
  };
  double t0 = 1790000000.0;
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
    td_runspec_t rs;
    td_runspec_defaults(&rs);
    td_runspec_set_arg(&rs, "model=mlp:784-64-10", why, sizeof why);
    td_runspec_set_arg(&rs, "lr=0.05", why, sizeof why);
    for (int s = 0; runs[k].sets[s]; s++)
      if (td_runspec_set_arg(&rs, runs[k].sets[s], why, sizeof why) != 0)
        return fail(why);
    char spec[16384];
    td_runspec_format(&rs, spec, sizeof spec);
    double start = t0 + 1000.0 * (double)k;
    char detail[128];
    uint64_t run_id = runs[k].id ^ id_mark;
    if (td_ledger_run_start(l, run_id, spec, start) != 0)
      return fail("run_start");
    snprintf(detail, sizeof detail, "run %016llx rank %d of %d, from round 0",
             (unsigned long long)run_id, node, nodes);
    td_ledger_event_add(l, start, "run_start", detail);
    double t = start;
    for (unsigned r = 1; r <= runs[k].rounds; r++) {
      td_ledger_begin(l);
      double len = 1.5 + 0.5 * (double)k + 0.1 * node;
      td_ledger_round_t row = {
          .run_id = run_id, .round = r, .started = t, .ended = t + len, .eval_bpb = NAN,
          .local_steps = 16, .batch = 64, .samples = 1024 + 32 * (uint64_t)node,
          .loss = 2.3 / (1.0 + 0.3 * r + 0.1 * (double)k) + 0.01 * node,
          .eval_acc = r % 2 == 0 ? 0.5 + 0.4 * (1.0 - 1.0 / (1.0 + 0.3 * r)) - 0.02 * (double)k
                                 : NAN,
          .bytes_sent = (50000 * (k == 1 ? 1 : 20) + 100 * (uint64_t)node) * (uint64_t)(nodes - 1),
          .bytes_recv = 40000, .lr = 0.05,
          .compute_s = 0.8, .wait_s = 0.2 + 0.1 * (double)k, .capacity = 700.0,
          .members = members[0] ? members : NULL};
      if (td_ledger_round_add(l, &row) != 0)
        return fail("round_add");
      if (runs[k].updates) {
        for (unsigned u = 0; u < 2; u++) {
          td_ledger_update_t up = {.run_id = run_id, .round = r, .peer = 0xfeed0000ull + u,
                                   .peer_round = r - (u == 1 && r > 1), .staleness = u == 1 && r > 1,
                                   .bytes = 30000, .codec = k == 1 ? "topk:0.01" : "none",
                                   .ratio = k == 1 ? 40.0 : 1.0, .arrived = t + len - 0.1};
          if (td_ledger_update_add(l, &up) != 0)
            return fail("update_add");
        }
        td_ledger_link_t link = {.run_id = run_id, .round = r, .peer = 0xfeed0000ull,
                                 .at = t + len, .goodput_bps = 250000.0 * (1 + (double)k) + r * 1000,
                                 .rtt_ms = 12.5, .codec = k == 1 ? "topk:0.01" : "none",
                                 .budget_bytes = 1e6, .window_bytes = 65536, .bytes_sent = 50000};
        if (td_ledger_link_add(l, &link) != 0)
          return fail("link_add");
      }
      if (td_ledger_commit(l) != 0)
        return fail("commit");
      if (r == 3)
        td_ledger_event_add(l, t + 0.5, "late", "round 3 peer 00000000feed0001, \"slow\"");
      t += len;
    }
    if (td_ledger_run_end(l, run_id, "finished", t + 0.5, 0.8 - 0.03 * (double)k) != 0)
      return fail("run_end");
    snprintf(detail, sizeof detail, "run %016llx finished", (unsigned long long)run_id);
    td_ledger_event_add(l, t + 0.5, "run_end", detail);
  }
  /* an event outside every run: no export may include it */
  td_ledger_event_add(l, t0 - 50.0, "start", "node started");
  td_ledger_close(&l);
  return 0;
}
