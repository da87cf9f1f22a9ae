/* replay.c: runs a libFuzzer target without libFuzzer, for `make check`.
 * Every file of the corpus directory (TD_FUZZ_CORPUS, or the arguments) is fed
 * to LLVMFuzzerTestOneInput as it is, then 200 deterministic mutations of it
 * (bit flips, truncations, duplicated spans), so the corpus keeps guarding the
 * decoder even on machines without clang. Any crash fails the test. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/rng.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path, td_rng_t *rng) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return -1;
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0, r;
  do {
    if (len == cap) {
      cap = cap ? cap * 2 : 4096;
      buf = realloc(buf, cap);
      if (buf == NULL) {
        fclose(f);
        return -1;
      }
    }
    r = fread(buf + len, 1, cap - len, f);
    len += r;
  } while (r > 0);
  fclose(f);
  LLVMFuzzerTestOneInput(buf, len);
  uint8_t *m = malloc(2 * len + 16);
  for (int i = 0; i < 200 && m != NULL; i++) {
    size_t mlen = len;
    memcpy(m, buf, len);
    switch (i % 4) {
    case 0: /* flip a few bits */
      for (int k = 0; k < 1 + i % 7 && mlen; k++)
        m[td_rng_below(rng, (uint32_t)mlen)] ^= (uint8_t)(1u << td_rng_below(rng, 8));
      break;
    case 1: /* truncate */
      mlen = len ? td_rng_below(rng, (uint32_t)len) : 0;
      break;
    case 2: /* overwrite a 4-byte field with an extreme value */
      if (mlen >= 4) {
        static const uint32_t extreme[] = {0, 1, 0x7fffffff, 0xffffffff, 0x80000000, 65536};
        uint32_t v = extreme[td_rng_below(rng, 6)];
        memcpy(m + td_rng_below(rng, (uint32_t)(mlen - 3)), &v, 4);
      }
      break;
    default: /* duplicate a span at the end */
      if (mlen) {
        size_t from = td_rng_below(rng, (uint32_t)mlen);
        size_t span = td_rng_below(rng, (uint32_t)(mlen - from)) + 1;
        memcpy(m + mlen, m + from, span);
        mlen += span;
      }
      break;
    }
    LLVMFuzzerTestOneInput(m, mlen);
  }
  free(m);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  const char *dirs[16];
  int nd = 0;
  for (int i = 1; i < argc && nd < 16; i++)
    dirs[nd++] = argv[i];
#ifdef TD_FUZZ_CORPUS
  if (nd == 0)
    dirs[nd++] = TD_FUZZ_CORPUS;
#endif
  td_rng_t rng;
  td_rng_seed(&rng, 2026);
  int files = 0;
  for (int d = 0; d < nd; d++) {
    DIR *dir = opendir(dirs[d]);
    if (dir == NULL) {
      fprintf(stderr, "replay: cannot open corpus %s\n", dirs[d]);
      return 1;
    }
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
      if (e->d_name[0] == '.')
        continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", dirs[d], e->d_name);
      if (replay_file(path, &rng) == 0)
        files++;
    }
    closedir(dir);
  }
  printf("replayed %d corpus files with 200 mutations each\n", files);
  return files > 0 ? 0 : 1;
}
