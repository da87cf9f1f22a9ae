/* keys.c: the node key file and the allowlist file (daemon/net/keys.h).
 *
 * Main or loop thread; no state beyond the allowlist object. Everything read
 * here is treated as hostile input: a key is exactly 40 characters of the Z85
 * alphabet, a line is a key and known words only, and a file with loose
 * permissions is refused rather than trusted. */
#include "daemon/net/keys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/error.h"

#define LINE_MAX_BYTES 512

static const char z85_alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   ".-:+=^!/*?&<>()[]{}@%$#";

struct td_allowlist {
  char path[1024];
  td_allowed_key_t keys[TD_ALLOWLIST_MAX];
  size_t count;
};

int td_key_decode(const char *z85, uint8_t raw[TD_KEY_BYTES], char *why, size_t why_len) {
  size_t len = strnlen(z85, TD_KEY_Z85_LEN + 1);
  if (len != TD_KEY_Z85_LEN)
    return td_why(why, why_len, TD_ECONFIG, "a key is %d Z85 characters, got %s%zu",
                  TD_KEY_Z85_LEN, len > TD_KEY_Z85_LEN ? "more than " : "", len);
  for (size_t i = 0; i < len; i++)
    if (strchr(z85_alphabet, z85[i]) == NULL || z85[i] == '\0')
      return td_why(why, why_len, TD_ECONFIG, "a key holds a character outside Z85 at %zu",
                    i + 1);
  if (zmq_z85_decode(raw, z85) == NULL)
    return td_why(why, why_len, TD_ECONFIG, "not a Z85 key");
  return 0;
}

uint64_t td_key_node_id(const uint8_t raw[TD_KEY_BYTES]) {
  uint64_t id = 0;
  for (int i = 0; i < 8; i++)
    id = id << 8 | raw[i];
  return id != 0 ? id : 1;
}

/* ---- the key pair ------------------------------------------------------------------ */

static int write_file(const char *path, const char *text, mode_t mode, char *why,
                      size_t why_len) {
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  unlink(tmp);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0)
    return td_why(why, why_len, TD_EIO, "cannot write %s: %s", tmp, strerror(errno));
  size_t len = strlen(text);
  bool ok = fchmod(fd, mode) == 0 && write(fd, text, len) == (ssize_t)len && fsync(fd) == 0;
  int err = errno;
  if (close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok || rename(tmp, path) != 0) {
    if (ok)
      err = errno;
    unlink(tmp);
    return td_why(why, why_len, TD_EIO, "cannot write %s: %s", path, strerror(err));
  }
  return 0;
}

static int parse_key_file(FILE *f, const char *path, td_keypair_t *kp, char *why,
                          size_t why_len) {
  char line[LINE_MAX_BYTES], sub[160];
  int lineno = 0;
  bool have_pub = false, have_secret = false;
  uint8_t raw[TD_KEY_BYTES];
  while (fgets(line, sizeof line, f) != NULL) {
    lineno++;
    line[strcspn(line, "\r\n")] = '\0';
    if (line[0] == '#' || line[0] == '\0')
      continue;
    char *sp = strchr(line, ' ');
    if (sp == NULL)
      return td_why(why, why_len, TD_ECONFIG, "%s:%d: expected 'public KEY' or 'secret KEY'",
                    path, lineno);
    *sp = '\0';
    const char *val = sp + 1;
    bool is_pub = strcmp(line, "public") == 0;
    if (!is_pub && strcmp(line, "secret") != 0)
      return td_why(why, why_len, TD_ECONFIG, "%s:%d: expected 'public KEY' or 'secret KEY'",
                    path, lineno);
    if (td_key_decode(val, raw, sub, sizeof sub) != 0)
      return td_why(why, why_len, TD_ECONFIG, "%s:%d: %s", path, lineno, sub);
    memcpy(is_pub ? kp->pub : kp->secret, val, TD_KEY_Z85_LEN + 1);
    if (is_pub) {
      memcpy(kp->pub_raw, raw, sizeof raw);
      have_pub = true;
    } else {
      have_secret = true;
    }
  }
  if (!have_pub || !have_secret)
    return td_why(why, why_len, TD_ECONFIG, "%s: needs a 'public' and a 'secret' line", path);
  char derived[TD_KEY_Z85_LEN + 1];
  if (zmq_curve_public(derived, kp->secret) != 0 || strcmp(derived, kp->pub) != 0)
    return td_why(why, why_len, TD_ECONFIG,
                  "%s: its public key does not belong to its secret key", path);
  return 0;
}

int td_keypair_load_or_create(const char *dir, td_keypair_t *kp, char *why, size_t why_len) {
  char path[1024], pub_path[1024];
  snprintf(path, sizeof path, "%s/" TD_KEY_FILE, dir);
  snprintf(pub_path, sizeof pub_path, "%s/" TD_KEY_PUB_FILE, dir);
  memset(kp, 0, sizeof *kp);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd >= 0) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      return td_why(why, why_len, TD_ECONFIG, "%s is not a regular file", path);
    }
    if ((st.st_mode & 077) != 0) {
      close(fd);
      return td_why(why, why_len, TD_ECONFIG,
                    "%s has mode %03o: a secret key must be readable by its owner only "
                    "(chmod 600 %s)",
                    path, (unsigned)(st.st_mode & 0777), path);
    }
    if (st.st_size > 4096) {
      close(fd);
      return td_why(why, why_len, TD_ECONFIG, "%s is too large for a key file", path);
    }
    FILE *f = fdopen(fd, "r");
    if (f == NULL) {
      close(fd);
      return td_why(why, why_len, TD_EIO, "cannot read %s: %s", path, strerror(errno));
    }
    int rc = parse_key_file(f, path, kp, why, why_len);
    fclose(f);
    if (rc != 0)
      return rc;
  } else if (errno == ENOENT) {
    if (zmq_curve_keypair(kp->pub, kp->secret) != 0)
      return td_why(why, why_len, TD_ECONFIG, "cannot make a CURVE key pair: %s",
                    zmq_strerror(zmq_errno()));
    zmq_z85_decode(kp->pub_raw, kp->pub);
    char text[256];
    snprintf(text, sizeof text, "# traind node key: keep secret\npublic %s\nsecret %s\n",
             kp->pub, kp->secret);
    int rc = write_file(path, text, 0600, why, why_len);
    memset(text, 0, sizeof text);
    if (rc != 0)
      return rc;
  } else {
    return td_why(why, why_len, TD_EIO, "cannot open %s: %s", path, strerror(errno));
  }
  char pub_text[TD_KEY_Z85_LEN + 2];
  snprintf(pub_text, sizeof pub_text, "%s\n", kp->pub);
  return write_file(pub_path, pub_text, 0644, why, why_len);
}

/* ---- the allowlist --------------------------------------------------------------------- */

static td_allowed_key_t *find_raw(const td_allowlist_t *a, const uint8_t raw[TD_KEY_BYTES]) {
  for (size_t i = 0; i < a->count; i++)
    if (memcmp(a->keys[i].raw, raw, TD_KEY_BYTES) == 0)
      return (td_allowed_key_t *)&a->keys[i];
  return NULL;
}

static int add_key(td_allowlist_t *a, const char *z85, bool admin, char *why, size_t why_len) {
  uint8_t raw[TD_KEY_BYTES];
  int rc = td_key_decode(z85, raw, why, why_len);
  if (rc != 0)
    return rc;
  td_allowed_key_t *k = find_raw(a, raw);
  if (k == NULL) {
    for (size_t i = 0; i < a->count; i++)
      if (a->keys[i].node_id == td_key_node_id(raw))
        return td_why(why, why_len, TD_ECONFIG, "two keys would share node id %016llx",
                      (unsigned long long)a->keys[i].node_id);
    if (a->count >= TD_ALLOWLIST_MAX)
      return td_why(why, why_len, TD_ERANGE, "the allowlist holds at most %d keys",
                    TD_ALLOWLIST_MAX);
    k = &a->keys[a->count++];
    memcpy(k->raw, raw, sizeof raw);
    memcpy(k->z85, z85, TD_KEY_Z85_LEN + 1);
    k->node_id = td_key_node_id(raw);
  }
  k->admin = admin;
  return 0;
}

static int parse_allowlist(td_allowlist_t *a, FILE *f, char *why, size_t why_len) {
  char line[LINE_MAX_BYTES + 2], sub[160];
  int lineno = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    lineno++;
    if (strchr(line, '\n') == NULL && !feof(f))
      return td_why(why, why_len, TD_ECONFIG, "%s:%d: line longer than %d bytes", a->path,
                    lineno, LINE_MAX_BYTES);
    /* '#' is a Z85 character: a comment is a word that starts with '#' and
     * is not in the key's place, or a line whose first word is just "#" */
    char *save = NULL, *key = strtok_r(line, " \t\r\n", &save);
    if (key == NULL || strcmp(key, "#") == 0 || (key[0] == '#' && strlen(key) != TD_KEY_Z85_LEN))
      continue;
    uint8_t raw[TD_KEY_BYTES];
    if (td_key_decode(key, raw, sub, sizeof sub) != 0)
      return td_why(why, why_len, TD_ECONFIG, "%s:%d: %s", a->path, lineno, sub);
    bool admin = false;
    for (char *w = strtok_r(NULL, " \t\r\n", &save); w != NULL && w[0] != '#';
         w = strtok_r(NULL, " \t\r\n", &save)) {
      if (strcmp(w, "admin") != 0)
        return td_why(why, why_len, TD_ECONFIG, "%s:%d: unknown word '%.32s' (expected 'admin')",
                      a->path, lineno, w);
      admin = true;
    }
    if (add_key(a, key, admin, sub, sizeof sub) != 0)
      return td_why(why, why_len, TD_ECONFIG, "%s:%d: %s", a->path, lineno, sub);
  }
  return 0;
}

int td_allowlist_load(td_allowlist_t **out, const char *path, char *why, size_t why_len) {
  *out = NULL;
  td_allowlist_t *a = calloc(1, sizeof *a);
  if (a == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  snprintf(a->path, sizeof a->path, "%s", path);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) {
    *out = a;
    return 0;
  }
  int rc = 0;
  struct stat st;
  if (fd < 0)
    rc = td_why(why, why_len, TD_EIO, "cannot open %s: %s", path, strerror(errno));
  else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    rc = td_why(why, why_len, TD_ECONFIG, "%s is not a regular file", path);
  else if ((st.st_mode & 022) != 0)
    rc = td_why(why, why_len, TD_ECONFIG,
                "%s has mode %03o: only its owner may write an allowlist (chmod 600 %s)", path,
                (unsigned)(st.st_mode & 0777), path);
  if (rc == 0) {
    FILE *f = fdopen(fd, "r");
    if (f == NULL) {
      rc = td_why(why, why_len, TD_EIO, "cannot read %s: %s", path, strerror(errno));
    } else {
      fd = -1;
      rc = parse_allowlist(a, f, why, why_len);
      fclose(f);
    }
  }
  if (fd >= 0)
    close(fd);
  if (rc != 0) {
    free(a);
    return rc;
  }
  *out = a;
  return 0;
}

void td_allowlist_close(td_allowlist_t **self_p) {
  if (self_p == NULL || *self_p == NULL)
    return;
  free(*self_p);
  *self_p = NULL;
}

int td_allowlist_save(const td_allowlist_t *a, char *why, size_t why_len) {
  size_t cap = 128 + a->count * (TD_KEY_Z85_LEN + 8);
  char *text = malloc(cap);
  if (text == NULL)
    return td_why(why, why_len, TD_ENOMEM, "out of memory");
  size_t len = (size_t)snprintf(text, cap,
                                "# traind allowlist: KEY [admin], one a line "
                                "(admin: may start and stop runs)\n");
  for (size_t i = 0; i < a->count; i++)
    len += (size_t)snprintf(text + len, cap - len, "%s%s\n", a->keys[i].z85,
                            a->keys[i].admin ? " admin" : "");
  int rc = write_file(a->path, text, 0600, why, why_len);
  free(text);
  return rc;
}

int td_allowlist_add(td_allowlist_t *a, const char *z85, bool admin, char *why, size_t why_len) {
  return add_key(a, z85, admin, why, why_len);
}

int td_allowlist_remove(td_allowlist_t *a, const char *z85) {
  uint8_t raw[TD_KEY_BYTES];
  char why[8];
  if (td_key_decode(z85, raw, why, sizeof why) != 0)
    return TD_ENOENT;
  td_allowed_key_t *k = find_raw(a, raw);
  if (k == NULL)
    return TD_ENOENT;
  size_t i = (size_t)(k - a->keys);
  memmove(&a->keys[i], &a->keys[i + 1], (a->count - i - 1) * sizeof a->keys[0]);
  a->count--;
  return 0;
}

const td_allowed_key_t *td_allowlist_find_raw(const td_allowlist_t *a,
                                              const uint8_t raw[TD_KEY_BYTES]) {
  return find_raw(a, raw);
}

const td_allowed_key_t *td_allowlist_find_z85(const td_allowlist_t *a, const char *z85) {
  uint8_t raw[TD_KEY_BYTES];
  char why[8];
  return td_key_decode(z85, raw, why, sizeof why) == 0 ? find_raw(a, raw) : NULL;
}

const td_allowed_key_t *td_allowlist_find_id(const td_allowlist_t *a, uint64_t node_id) {
  for (size_t i = 0; i < a->count; i++)
    if (a->keys[i].node_id == node_id)
      return &a->keys[i];
  return NULL;
}

size_t td_allowlist_count(const td_allowlist_t *a) { return a->count; }

const td_allowed_key_t *td_allowlist_at(const td_allowlist_t *a, size_t i) {
  return i < a->count ? &a->keys[i] : NULL;
}
