/* runkeys.h: the run-key table that runspec.c walks, for the run/ files only.
 * Each row names a key, its type and field in td_runspec_t, its default (as
 * text, parsed by the same code as user input), its accepted range, an
 * optional checker for structured strings and its help line. */
#ifndef TD_RUN_RUNKEYS_H
#define TD_RUN_RUNKEYS_H

#include <stddef.h>

#include "daemon/run/runspec.h"

typedef enum { KEY_STR, KEY_UINT, KEY_U64, KEY_DOUBLE, KEY_BOOL } key_type_t;

typedef int (*key_check_fn)(td_runspec_t *rs, const char *value, char *why, size_t why_len);

typedef struct {
  const char *name;
  key_type_t type;
  size_t offset;
  const char *default_value;
  double min, max; /* numeric keys */
  key_check_fn check;
  const char *help;
} run_key_t;

/* topology = gossip or groups with what it cannot take: TD_ECONFIG and a
 * one-line why saying what to change; 0 otherwise (auto falls back to the
 * mesh instead, td_runspec_topology). */
int td_runspec_check_topology(const td_runspec_t *rs, char *why, size_t why_len);

/* The table, in help order, and its length (at most TD__RUN_KEYS_MAX). */
extern const run_key_t td__run_keys[];
extern const size_t td__run_keys_n;
#define TD__RUN_KEYS_MAX 128

#endif
