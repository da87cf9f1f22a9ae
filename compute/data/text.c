/* text.c: byte-level text datasets (text.h): resolving `text:` specs, the
 * fortunes concatenation, the held-out split, training windows and partitions.
 *
 * A text is one owned byte array. Every file goes through td_file_read_all, so
 * a FIFO or a device is refused before any read and the size is bounded before
 * the allocation. Windows are drawn with the caller's rng, so a trainer that
 * seeds it per node and step gets reproducible batches. Runs on whichever
 * thread loads data (the compute thread of a run, the main thread standalone). */
#include "compute/data/text.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "compute/data/file.h"

struct td_text {
  uint8_t *data;
  size_t bytes;
};

/* Same stream as compute/data/partition.c, so `seed` means one thing for both. */
#define TD__TEXT_PARTITION_STREAM 0x5041525449ull /* "PARTI" */
#define TD__TEXT_MAX_NODES 4096u
#define TD__TEXT_MAX_FILES 4096u
#define TD__TEXT_PATH_MAX 4096

int td_text_is_spec(const char *spec) { return spec != NULL && strncmp(spec, "text:", 5) == 0; }

static td_text_t *text_adopt(uint8_t *data, size_t bytes) {
  td_text_t *t = calloc(1, sizeof *t);
  if (t == NULL)
    return NULL;
  t->data = data;
  t->bytes = bytes;
  return t;
}

int td_text_from_bytes(td_text_t **out, const uint8_t *bytes, size_t len) {
  if (out == NULL)
    return TD_EINVAL;
  *out = NULL;
  if (bytes == NULL || len == 0 || len > TD_TEXT_MAX_BYTES)
    return TD_EINVAL;
  uint8_t *copy = malloc(len);
  if (copy == NULL)
    return TD_ENOMEM;
  memcpy(copy, bytes, len);
  if ((*out = text_adopt(copy, len)) == NULL) {
    free(copy);
    return TD_ENOMEM;
  }
  return 0;
}

void td_text_close(td_text_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  free((*self_p)->data);
  free(*self_p);
  *self_p = NULL;
}

size_t td_text_bytes(const td_text_t *t) { return t->bytes; }
const uint8_t *td_text_data(const td_text_t *t) { return t->data; }

int td_text_check_window(const td_text_t *t, int context, const char *what, char *why,
                         size_t why_len) {
  if (context < 1)
    return td_why(why, why_len, TD_ECONFIG, "context %d is not >= 1", context);
  if (t->bytes < (size_t)context + 1)
    return td_why(why, why_len, TD_ECORRUPT,
                  "the %s has %zu bytes, shorter than one window of context + 1 = %d bytes",
                  what ? what : "text", t->bytes, context + 1);
  return 0;
}

void td_text_windows(const uint8_t *data, size_t bytes, int context, int rows, td_rng_t *rng,
                     int32_t *tokens, int32_t *targets) {
  size_t offsets = bytes - (size_t)context; /* o in [0, bytes - context - 1] */
  for (int r = 0; r < rows; r++) {
    size_t o = offsets <= UINT32_MAX ? td_rng_below(rng, (uint32_t)offsets)
                                     : (size_t)(td_rng_next(rng) % (uint64_t)offsets);
    const uint8_t *src = data + o;
    int32_t *tok = tokens + (size_t)r * (size_t)context;
    int32_t *tgt = targets + (size_t)r * (size_t)context;
    for (int t = 0; t < context; t++) {
      tok[t] = src[t];
      tgt[t] = src[t + 1];
    }
  }
}

/* ---- opening ------------------------------------------------------------- */

/* One file as a text; an empty file is refused. */
static int read_text(td_text_t **out, const char *path, char *why, size_t why_len) {
  uint8_t *data;
  size_t len;
  int rc = td_file_read_all(path, TD_TEXT_MAX_BYTES, &data, &len, why, why_len);
  if (rc != 0)
    return rc;
  if (len == 0) {
    free(data);
    return td_why(why, why_len, TD_ECORRUPT, "%s: empty file, no text to train on", path);
  }
  if ((*out = text_adopt(data, len)) == NULL) {
    free(data);
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  }
  return 0;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
}

/* The regular files of dir whose names have no dot (the fortune texts, not
 * their .dat indexes or .u8 links), sorted by name. */
static int fortune_names(const char *dir, char ***names_out, size_t *n_out, char *why,
                         size_t why_len) {
  *names_out = NULL;
  *n_out = 0;
  DIR *d = opendir(dir);
  if (d == NULL)
    return td_why(why, why_len, errno == ENOENT || errno == ENOTDIR ? TD_ENOENT : TD_EIO,
                  "fortunes directory %s: %s (install the Debian package %s: apt-get install %s)",
                  dir, strerror(errno), TD_FORTUNES_PKG, TD_FORTUNES_PKG);
  char **names = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && rc == 0) {
    if (strchr(e->d_name, '.') != NULL)
      continue;
    char path[TD__TEXT_PATH_MAX];
    struct stat st;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path ||
        stat(path, &st) != 0 || !S_ISREG(st.st_mode))
      continue; /* e.g. the off/ subdirectory of fortunes-off */
    if (n == TD__TEXT_MAX_FILES) {
      rc = td_why(why, why_len, TD_ECORRUPT, "fortunes directory %s: more than %u files", dir,
                  TD__TEXT_MAX_FILES);
      break;
    }
    if (n == cap) {
      size_t new_cap = cap ? cap * 2 : 64;
      char **grown = realloc(names, new_cap * sizeof *names);
      if (grown == NULL) {
        rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
        break;
      }
      names = grown;
      cap = new_cap;
    }
    if ((names[n] = strdup(e->d_name)) == NULL) {
      rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
      break;
    }
    n++;
  }
  closedir(d);
  if (rc == 0 && n == 0)
    rc = td_why(why, why_len, TD_ENOENT,
                "no fortune files in %s (install the Debian package %s: apt-get install %s)", dir,
                TD_FORTUNES_PKG, TD_FORTUNES_PKG);
  if (rc != 0) {
    free_names(names, n);
    return rc;
  }
  qsort(names, n, sizeof *names, cmp_names);
  *names_out = names;
  *n_out = n;
  return 0;
}

/* The fortune files concatenated in sorted name order. */
static int read_fortunes(td_text_t **out, char *why, size_t why_len) {
  const char *dir = getenv("TRAIND_FORTUNES_DIR");
  if (dir == NULL || dir[0] == '\0')
    dir = TD_FORTUNES_DIR;
  char **names;
  size_t n;
  int rc = fortune_names(dir, &names, &n, why, why_len);
  if (rc != 0)
    return rc;
  uint8_t *all = NULL;
  size_t bytes = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    char path[TD__TEXT_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    uint8_t *part;
    size_t len;
    if ((rc = td_file_read_all(path, TD_TEXT_MAX_BYTES - bytes, &part, &len, why, why_len)) != 0)
      break;
    uint8_t *grown = len > 0 ? realloc(all, bytes + len) : all;
    if (len > 0 && grown == NULL)
      rc = td_why(why, why_len, TD_ENOMEM, "out of memory for the fortunes text");
    else if (len > 0) {
      memcpy(grown + bytes, part, len);
      all = grown;
      bytes += len;
    }
    free(part);
  }
  free_names(names, n);
  if (rc == 0 && bytes == 0)
    rc = td_why(why, why_len, TD_ECORRUPT, "the fortune files in %s are all empty", dir);
  if (rc == 0 && (*out = text_adopt(all, bytes)) == NULL)
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
  if (rc != 0)
    free(all);
  return rc;
}

/* Cut the last TD_TEXT_VALID_PERCENT percent of *train off into *valid. */
static int split_held_out(td_text_t *train, td_text_t **valid, const char *spec, char *why,
                          size_t why_len) {
  size_t held = train->bytes / 100 * TD_TEXT_VALID_PERCENT +
                train->bytes % 100 * TD_TEXT_VALID_PERCENT / 100;
  if (held == 0)
    held = 1;
  if (held >= train->bytes)
    return td_why(why, why_len, TD_ECORRUPT,
                  "dataset '%s': %zu bytes, too short to hold %d%% out for validation", spec,
                  train->bytes, TD_TEXT_VALID_PERCENT);
  int rc = td_text_from_bytes(valid, train->data + train->bytes - held, held);
  if (rc != 0)
    return td_why(why, why_len, rc, "out of memory");
  train->bytes -= held;
  uint8_t *shrunk = realloc(train->data, train->bytes);
  if (shrunk != NULL) /* failing to give back the tail is harmless */
    train->data = shrunk;
  return 0;
}

int td_text_open(td_text_t **train, td_text_t **valid, const char *spec, char *why,
                 size_t why_len) {
  if (train == NULL || valid == NULL)
    return td_why(why, why_len, TD_EINVAL, "no output pointers");
  *train = *valid = NULL;
  if (!td_text_is_spec(spec))
    return td_why(why, why_len, TD_ECONFIG,
                  "dataset '%s' is not text (accepted: text:fortunes, text:PATH[,VALID_PATH])",
                  spec ? spec : "(null)");
  const char *rest = spec + 5;
  const char *comma = strchr(rest, ',');
  size_t first_len = comma ? (size_t)(comma - rest) : strlen(rest);
  if (first_len == 0 || first_len >= TD__TEXT_PATH_MAX || (comma && comma[1] == '\0') ||
      (comma && (strchr(comma + 1, ',') != NULL || strlen(comma + 1) >= TD__TEXT_PATH_MAX)))
    return td_why(why, why_len, TD_ECONFIG,
                  "dataset '%s': expected text:fortunes or text:PATH[,VALID_PATH]", spec);
  int rc;
  if (comma == NULL && strcmp(rest, "fortunes") == 0) {
    rc = read_fortunes(train, why, why_len);
  } else {
    char path[TD__TEXT_PATH_MAX];
    memcpy(path, rest, first_len);
    path[first_len] = '\0';
    rc = read_text(train, path, why, why_len);
    if (rc == 0 && comma != NULL)
      rc = read_text(valid, comma + 1, why, why_len);
  }
  if (rc == 0 && *valid == NULL)
    rc = split_held_out(*train, valid, spec, why, why_len);
  if (rc != 0) {
    td_text_close(train);
    td_text_close(valid);
  }
  return rc;
}

/* ---- partitions ---------------------------------------------------------- */

/* Byte i * bytes / parts, exact: bytes <= 2^30 and i <= parts <= 2^30 keep the
 * product inside 64 bits. */
static size_t cut_at(size_t bytes, uint64_t i, uint64_t parts) {
  return (size_t)((uint64_t)bytes * i / parts);
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* Deal k near-equal contiguous shards of src to each of `nodes` nodes by a
 * seeded permutation; node's shards are concatenated in text order. Requires
 * 1 <= k * nodes <= src->bytes (every shard holds at least one byte). */
static int deal_shards(td_text_t **out, const td_text_t *src, uint64_t k, unsigned node,
                       unsigned nodes, uint64_t seed, char *why, size_t why_len) {
  uint64_t shards = k * nodes;
  uint32_t *perm = malloc((size_t)shards * sizeof *perm);
  if (perm == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  for (uint32_t i = 0; i < shards; i++)
    perm[i] = i;
  td_rng_t rng;
  td_rng_seed2(&rng, seed, TD__TEXT_PARTITION_STREAM);
  td_rng_shuffle_u32(&rng, perm, (size_t)shards);
  uint32_t *mine = perm + (size_t)node * k; /* this node's K shards, in text order */
  qsort(mine, (size_t)k, sizeof *mine, cmp_u32);
  size_t total = 0;
  for (size_t i = 0; i < k; i++)
    total += cut_at(src->bytes, mine[i] + 1ull, shards) - cut_at(src->bytes, mine[i], shards);
  uint8_t *data = malloc(total); /* every shard holds >= 1 byte: shards <= bytes */
  int rc = 0;
  if (data == NULL)
    rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
  if (rc == 0) {
    size_t at = 0;
    for (size_t i = 0; i < k; i++) {
      size_t b = cut_at(src->bytes, mine[i], shards);
      size_t e = cut_at(src->bytes, mine[i] + 1ull, shards);
      memcpy(data + at, src->data + b, e - b);
      at += e - b;
    }
    if ((*out = text_adopt(data, total)) == NULL)
      rc = td_why(why, why_len, TD_ENOMEM, "out of memory");
  }
  free(perm);
  if (rc != 0)
    free(data);
  return rc;
}

int td_text_partition(td_text_t **out, const td_text_t *src, const td_partition_t *p,
                      unsigned node, unsigned nodes, uint64_t seed, char *why, size_t why_len) {
  if (out == NULL)
    return td_why(why, why_len, TD_EINVAL, "no output pointer");
  *out = NULL;
  if (src == NULL || p == NULL || nodes == 0 || nodes > TD__TEXT_MAX_NODES || node >= nodes)
    return td_why(why, why_len, TD_EINVAL, "bad text partition request (node %u of %u)", node,
                  nodes);
  switch (p->kind) {
  case TD_PARTITION_ALL:
    return td_text_from_bytes(out, src->data, src->bytes) == 0
               ? 0
               : td_why(why, why_len, TD_ENOMEM, "out of memory");
  case TD_PARTITION_DIRICHLET:
    return td_why(why, why_len, TD_ECONFIG,
                  "partition dirichlet skews class proportions and text has no classes "
                  "(accepted for text: all, iid, shard:K)");
  case TD_PARTITION_IID: {
    if (src->bytes < nodes)
      return td_why(why, why_len, TD_ECONFIG,
                    "partition iid gives node %u of %u no bytes of a %zu-byte text", node, nodes,
                    src->bytes);
    uint64_t k = src->bytes / ((uint64_t)nodes * TD_TEXT_IID_BLOCK);
    return deal_shards(out, src, k > 0 ? k : 1, node, nodes, seed, why, why_len);
  }
  case TD_PARTITION_SHARD:
    break;
  }
  uint64_t k = p->shards_per_node, shards = k * nodes;
  if (k == 0 || shards > src->bytes)
    return td_why(why, why_len, TD_ECONFIG,
                  "partition shard:%u over %u nodes cuts %llu shards, more than the %zu bytes "
                  "of text",
                  p->shards_per_node, nodes, (unsigned long long)shards, src->bytes);
  return deal_shards(out, src, k, node, nodes, seed, why, why_len);
}
