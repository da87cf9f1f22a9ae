/* settings.h: the daemon's own settings (not the run's): where it keeps its
 * data, where it listens, logging. Read from an INI file ([daemon] section or
 * top level, parsed with inih) and then from command-line flags of the same
 * names (--data-dir for data_dir), flags winning. */
#ifndef TD_SETTINGS_H
#define TD_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct {
  char data_dir[512];
  char listen[256];
  char advertise[256]; /* tcp://HOST:PORT peers dial; "" = the listen address (routed if wildcard) */
  char control[512];
  char log_level[16];
  unsigned threads;
  unsigned heartbeat_ms;
  unsigned link_delay_ms;
  unsigned uplink_kbit; /* 0 = no user-space cap */
  char metrics[256]; /* HOST:PORT for GET /metrics; "" = off */
  unsigned max_model_mb, max_batch, max_rounds, max_checkpoint_mb; /* 0 = default (node.h) */
  char data_root[512]; /* "" = named datasets only */
  bool insecure, insecure_force; /* plain TCP peers (loopback only unless forced) */
} td_settings_t;

void td_settings_defaults(td_settings_t *c);
/* Set one key (data_dir, listen, advertise, control, log_level, threads, heartbeat_ms, link_delay_ms,
 * metrics, max_model_mb, max_batch, max_rounds, max_checkpoint_mb, data_root, insecure,
 * insecure_force).
 * TD_ECONFIG + why on an unknown key or a bad value. */
int td_settings_set(td_settings_t *c, const char *key, const char *value, char *why, size_t why_len);
/* Apply an INI file; TD_ENOENT / TD_ECONFIG (with the line) + why. */
int td_settings_load(td_settings_t *c, const char *path, char *why, size_t why_len);
void td_settings_print_help(FILE *out);

/* Create `data_dir` (and its parents, mode 0700) if needed. 0, or TD_EIO + why. */
int td_settings_make_data_dir(const char *data_dir, char *why, size_t why_len);

/* Create `data_dir` if needed and lock it for the life of the process: an
 * exclusive flock on DATA_DIR/traind.lock, which then holds our pid. A second
 * traind on the same directory would share the node id and take the control
 * socket over, so it gets TD_EIO and a why naming the directory and the pid
 * holding it. On success *fd_out is the lock file's descriptor (close-on-exec),
 * which the caller keeps open until it exits. */
int td_settings_lock_data_dir(const char *data_dir, int *fd_out, char *why, size_t why_len);

#endif
