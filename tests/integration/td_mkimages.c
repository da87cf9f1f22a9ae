/* td_mkimages.c: writes an images:DIR dataset for cluster_images.sh.
 *
 *   td_mkimages DIR PER_CLASS SIZE SEED
 *
 * makes DIR/red, DIR/green, DIR/blue (class ids 2, 1, 0 once sorted: blue,
 * green, red), each with PER_CLASS SIZE x SIZE RGB images, even-numbered
 * ones PNG (libpng) and odd-numbered ones JPEG (libjpeg-turbo, quality 90).
 * An image is noise over a random dark background, with a square of its
 * class's dominant colour at a random place and of a random brightness: the
 * classes are separable by colour, yet no pixel position tells them apart,
 * so a model has to look. Deterministic in SEED. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jpeglib.h>
#include <png.h>

static uint64_t rng_state;

static uint32_t next_u32(void) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)(rng_state >> 33);
}

static int below(int n) { return (int)(next_u32() % (uint32_t)n); }

static int write_png(const char *path, const uint8_t *px, int size) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = (png_uint_32)size;
  img.height = (png_uint_32)size;
  img.format = PNG_FORMAT_RGB;
  if (!png_image_write_to_file(&img, path, 0, px, 0, NULL)) {
    fprintf(stderr, "td_mkimages: %s: %s\n", path, img.message);
    return -1;
  }
  return 0;
}

static int write_jpeg(const char *path, const uint8_t *px, int size) {
  FILE *f = fopen(path, "wb");
  if (f == NULL) {
    fprintf(stderr, "td_mkimages: %s: %s\n", path, strerror(errno));
    return -1;
  }
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  jpeg_stdio_dest(&c, f);
  c.image_width = (JDIMENSION)size;
  c.image_height = (JDIMENSION)size;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 90, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = (JSAMPROW)(px + (size_t)c.next_scanline * (size_t)size * 3);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  return fclose(f) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: td_mkimages DIR PER_CLASS SIZE SEED\n");
    return 2;
  }
  const char *dir = argv[1];
  int per_class = atoi(argv[2]), size = atoi(argv[3]);
  rng_state = strtoull(argv[4], NULL, 10) + 1;
  if (per_class < 1 || size < 4 || size > 256) {
    fprintf(stderr, "td_mkimages: PER_CLASS >= 1 and SIZE in [4, 256]\n");
    return 2;
  }
  static const char *const names[3] = {"red", "green", "blue"};
  uint8_t *px = malloc((size_t)size * (size_t)size * 3);
  if (px == NULL)
    return 1;
  char path[4096];
  mkdir(dir, 0755);
  for (int c = 0; c < 3; c++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[c]);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
      fprintf(stderr, "td_mkimages: %s: %s\n", path, strerror(errno));
      return 1;
    }
    for (int i = 0; i < per_class; i++) {
      int base = below(60);
      for (int k = 0; k < size * size * 3; k++)
        px[k] = (uint8_t)(base + below(40));
      int side = size / 4 + below(size / 4), x0 = below(size - side), y0 = below(size - side);
      int bright = 150 + below(100);
      for (int y = y0; y < y0 + side; y++)
        for (int x = x0; x < x0 + side; x++)
          px[((size_t)y * (size_t)size + (size_t)x) * 3 + (size_t)c] = (uint8_t)bright;
      snprintf(path, sizeof path, "%s/%s/%04d.%s", dir, names[c], i, i % 2 ? "jpg" : "png");
      if ((i % 2 ? write_jpeg(path, px, size) : write_png(path, px, size)) != 0)
        return 1;
    }
  }
  free(px);
  return 0;
}
