/* test_images.c: PNG/JPEG decoding (compute/data/image.h) and the
 * images:DIR dataset (td_dataset_load_images, compute/data/dataset.h).
 *
 * The images are written here with libpng's and libjpeg's own writers with
 * known pixels, then read back: PNG exactly (value / 255, channels first,
 * grey <-> RGB conversions), JPEG within the loss of quality 95 on flat
 * colours. Folder datasets check the class ids (sorted folder names), the
 * deterministic test split (every fifth file of a class), a TEST_DIR, and
 * the refusals: a size that differs from the model's, a symbolic link, a
 * stray file, mismatched class folders, a truncated file, and "bombs" that
 * declare a huge picture in a few bytes, which must be refused from the
 * header alone. Each test gets its own temporary directory. */
#include <check.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>
#include <png.h>
#include <zlib.h>

#include "common/error.h"
#include "compute/data/dataset.h"
#include "compute/data/file.h"
#include "compute/data/image.h"

#include "tests/unit/tmp_dir.h"

static void make_dir(const char *name) { ck_assert_int_eq(mkdir(tmp_path(name), 0700), 0); }

/* ---- writers ------------------------------------------------------------------ */

/* A PNG of interleaved 8-bit pixels (1 grey, 2 grey+alpha, 3 RGB, 4 RGBA). */
static void write_png(const char *path, const uint8_t *pixels, int w, int h, int channels) {
  static const png_uint_32 formats[5] = {0, PNG_FORMAT_GRAY, PNG_FORMAT_GA, PNG_FORMAT_RGB,
                                         PNG_FORMAT_RGBA};
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = (png_uint_32)w;
  img.height = (png_uint_32)h;
  img.format = formats[channels];
  ck_assert_msg(png_image_write_to_file(&img, path, 0, pixels, 0, NULL), "%s", img.message);
}

/* A JPEG of interleaved 8-bit pixels (1 grey or 3 RGB) at the given quality. */
static void write_jpeg(const char *path, const uint8_t *pixels, int w, int h, int channels,
                       int quality) {
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  jpeg_stdio_dest(&c, f);
  c.image_width = (JDIMENSION)w;
  c.image_height = (JDIMENSION)h;
  c.input_components = channels;
  c.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = (JSAMPROW)(pixels + (size_t)c.next_scanline * (size_t)(w * channels));
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  ck_assert_int_eq(fclose(f), 0);
}

static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(*len + 1);
  ck_assert_ptr_nonnull(buf);
  ck_assert_uint_eq(fread(buf, 1, *len, f), *len);
  fclose(f);
  return buf;
}

static void write_bytes(const char *path, const uint8_t *bytes, size_t len) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(bytes, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
}

/* A flat w x h RGB picture of one colour. */
static uint8_t *flat_rgb(int w, int h, uint8_t r, uint8_t g, uint8_t b) {
  uint8_t *p = malloc((size_t)w * (size_t)h * 3);
  ck_assert_ptr_nonnull(p);
  for (int i = 0; i < w * h; i++) {
    p[3 * i] = r;
    p[3 * i + 1] = g;
    p[3 * i + 2] = b;
  }
  return p;
}

/* ---- decoding ----------------------------------------------------------------- */

START_TEST(png_grey_reads_back_exactly) {
  uint8_t px[12];
  for (int i = 0; i < 12; i++)
    px[i] = (uint8_t)(i * 21);
  write_png(tmp_path("g.png"), px, 4, 3, 1);
  size_t len;
  uint8_t *bytes = read_file(tmp_path("g.png"), &len);
  td_image_info_t info;
  char why[256];
  ck_assert_int_eq(td_image_probe(&info, bytes, len, "g.png", why, sizeof why), 0);
  ck_assert_int_eq(info.format, TD_IMAGE_PNG);
  ck_assert_uint_eq(info.width, 4);
  ck_assert_uint_eq(info.height, 3);
  ck_assert_int_eq(info.color, 0);
  float out[12];
  ck_assert_msg(td_image_decode(out, 1, 4, 3, bytes, len, "g.png", why, sizeof why) == 0, "%s",
                why);
  for (int i = 0; i < 12; i++)
    ck_assert_float_eq(out[i], (float)px[i] / 255.0f);
  /* grey as RGB: three identical planes */
  float rgb[36];
  ck_assert_int_eq(td_image_decode(rgb, 3, 4, 3, bytes, len, "g.png", why, sizeof why), 0);
  for (int c = 0; c < 3; c++)
    for (int i = 0; i < 12; i++)
      ck_assert_float_eq(rgb[c * 12 + i], (float)px[i] / 255.0f);
  free(bytes);
}
END_TEST

START_TEST(png_rgb_reads_back_channels_first) {
  const int w = 5, h = 2;
  uint8_t px[30];
  for (int i = 0; i < w * h; i++) {
    px[3 * i] = (uint8_t)(10 * i);
    px[3 * i + 1] = (uint8_t)(200 - 10 * i);
    px[3 * i + 2] = (uint8_t)(i * i);
  }
  write_png(tmp_path("c.png"), px, w, h, 3);
  size_t len;
  uint8_t *bytes = read_file(tmp_path("c.png"), &len);
  td_image_info_t info;
  char why[256];
  ck_assert_int_eq(td_image_probe(&info, bytes, len, "c.png", why, sizeof why), 0);
  ck_assert_int_eq(info.color, 1);
  float out[30];
  ck_assert_int_eq(td_image_decode(out, 3, w, h, bytes, len, "c.png", why, sizeof why), 0);
  for (int c = 0; c < 3; c++)
    for (int i = 0; i < w * h; i++)
      ck_assert_float_eq(out[c * w * h + i], (float)px[3 * i + c] / 255.0f);
  /* to grey: a pure grey pixel stays itself, a colour lands between its
   * smallest and largest channel */
  float grey[10];
  ck_assert_int_eq(td_image_decode(grey, 1, w, h, bytes, len, "c.png", why, sizeof why), 0);
  for (int i = 0; i < w * h; i++) {
    uint8_t lo = px[3 * i], hi = px[3 * i];
    for (int c = 1; c < 3; c++) {
      lo = px[3 * i + c] < lo ? px[3 * i + c] : lo;
      hi = px[3 * i + c] > hi ? px[3 * i + c] : hi;
    }
    ck_assert_msg(grey[i] >= (float)lo / 255.0f - 0.01f && grey[i] <= (float)hi / 255.0f + 0.01f,
                  "pixel %d: grey %f outside [%u, %u]/255", i, grey[i], lo, hi);
  }
  free(bytes);
}
END_TEST

START_TEST(png_alpha_is_composited_onto_black) {
  uint8_t px[4 * 2] = {200, 255, 200, 0, 100, 128, 0, 0}; /* grey+alpha */
  write_png(tmp_path("a.png"), px, 4, 1, 2);
  size_t len;
  uint8_t *bytes = read_file(tmp_path("a.png"), &len);
  float out[4];
  char why[256];
  ck_assert_int_eq(td_image_decode(out, 1, 4, 1, bytes, len, "a.png", why, sizeof why), 0);
  ck_assert_float_eq(out[0], 200.0f / 255.0f); /* opaque */
  ck_assert_float_eq(out[1], 0.0f);            /* transparent: black */
  ck_assert(out[2] > 0.1f && out[2] < 0.35f);  /* half of 100 (in linear light) */
  free(bytes);
}
END_TEST

START_TEST(jpeg_flat_colours_read_back_within_the_loss) {
  const int w = 16, h = 16;
  uint8_t *px = flat_rgb(w, h, 200, 40, 90);
  write_jpeg(tmp_path("c.jpg"), px, w, h, 3, 95);
  size_t len;
  uint8_t *bytes = read_file(tmp_path("c.jpg"), &len);
  td_image_info_t info;
  char why[256];
  ck_assert_int_eq(td_image_probe(&info, bytes, len, "c.jpg", why, sizeof why), 0);
  ck_assert_int_eq(info.format, TD_IMAGE_JPEG);
  ck_assert_int_eq(info.color, 1);
  float out[3 * 16 * 16];
  ck_assert_msg(td_image_decode(out, 3, w, h, bytes, len, "c.jpg", why, sizeof why) == 0, "%s",
                why);
  const uint8_t want[3] = {200, 40, 90};
  for (int c = 0; c < 3; c++)
    for (int i = 0; i < w * h; i++)
      ck_assert_msg(fabsf(out[c * w * h + i] * 255.0f - want[c]) <= 4.0f,
                    "channel %d pixel %d: %f, want %u", c, i, out[c * w * h + i] * 255, want[c]);
  free(bytes);
  free(px);
}
END_TEST

START_TEST(jpeg_grey_reads_as_grey_and_as_rgb) {
  uint8_t px[8 * 8];
  memset(px, 77, sizeof px);
  write_jpeg(tmp_path("g.jpg"), px, 8, 8, 1, 95);
  size_t len;
  uint8_t *bytes = read_file(tmp_path("g.jpg"), &len);
  char why[256];
  float grey[64], rgb[192];
  ck_assert_int_eq(td_image_decode(grey, 1, 8, 8, bytes, len, "g.jpg", why, sizeof why), 0);
  ck_assert_int_eq(td_image_decode(rgb, 3, 8, 8, bytes, len, "g.jpg", why, sizeof why), 0);
  for (int i = 0; i < 64; i++) {
    ck_assert(fabsf(grey[i] * 255.0f - 77.0f) <= 2.0f);
    for (int c = 0; c < 3; c++)
      ck_assert_float_eq(rgb[c * 64 + i], grey[i]);
  }
  free(bytes);
}
END_TEST

START_TEST(a_size_other_than_the_wanted_one_is_refused) {
  uint8_t *px = flat_rgb(6, 4, 1, 2, 3);
  write_png(tmp_path("s.png"), px, 6, 4, 3);
  size_t len;
  uint8_t *bytes = read_file(tmp_path("s.png"), &len);
  char why[256];
  float out[3 * 24];
  ck_assert_int_eq(td_image_decode(out, 3, 4, 6, bytes, len, "s.png", why, sizeof why),
                   TD_ESHAPE);
  ck_assert_ptr_nonnull(strstr(why, "s.png: 6x4 pixels"));
  ck_assert_ptr_nonnull(strstr(why, "4x6"));
  free(bytes);
  free(px);
}
END_TEST

/* Patch the IHDR of a valid PNG to declare other dimensions (and fix its CRC,
 * so only the size is wrong). */
static void png_set_size(uint8_t *bytes, uint32_t w, uint32_t h) {
  /* signature 8, length 4, "IHDR" 4, width 4, height 4 ... CRC after 13 bytes */
  for (int i = 0; i < 4; i++) {
    bytes[16 + i] = (uint8_t)(w >> (24 - 8 * i));
    bytes[20 + i] = (uint8_t)(h >> (24 - 8 * i));
  }
  uint32_t crc = (uint32_t)crc32(0, bytes + 12, 17);
  for (int i = 0; i < 4; i++)
    bytes[29 + i] = (uint8_t)(crc >> (24 - 8 * i));
}

/* The SOF0 marker's height and width in a baseline JPEG. */
static void jpeg_set_size(uint8_t *bytes, size_t len, uint16_t w, uint16_t h) {
  for (size_t i = 2; i + 9 < len; i++)
    if (bytes[i] == 0xff && bytes[i + 1] == 0xc0) {
      bytes[i + 5] = (uint8_t)(h >> 8);
      bytes[i + 6] = (uint8_t)h;
      bytes[i + 7] = (uint8_t)(w >> 8);
      bytes[i + 8] = (uint8_t)w;
      return;
    }
  ck_abort_msg("no SOF0 marker");
}

START_TEST(bombs_are_refused_from_the_header) {
  uint8_t *px = flat_rgb(8, 8, 9, 9, 9);
  write_png(tmp_path("b.png"), px, 8, 8, 3);
  write_jpeg(tmp_path("b.jpg"), px, 8, 8, 3, 90);
  size_t plen, jlen;
  uint8_t *png = read_file(tmp_path("b.png"), &plen);
  uint8_t *jpg = read_file(tmp_path("b.jpg"), &jlen);
  png_set_size(png, 60000, 60000);
  jpeg_set_size(jpg, jlen, 65000, 65000);
  td_image_info_t info;
  char why[256];
  float out[192];
  ck_assert_int_eq(td_image_probe(&info, png, plen, "b.png", why, sizeof why), TD_ECORRUPT);
  ck_assert_msg(strstr(why, "b.png: PNG declares 60000x60000 pixels, beyond the limit") != NULL,
                "%s", why);
  ck_assert_int_eq(td_image_decode(out, 3, 8, 8, jpg, jlen, "b.jpg", why, sizeof why),
                   TD_ECORRUPT);
  ck_assert_msg(strstr(why, "b.jpg: JPEG declares 65000x65000 pixels, beyond the limit") != NULL,
                "%s", why);
  /* just over the pixel budget, though each side is fine */
  jpeg_set_size(jpg, jlen, 1025, 1024);
  ck_assert_int_eq(td_image_probe(&info, jpg, jlen, "b.jpg", why, sizeof why), TD_ECORRUPT);
  free(png);
  free(jpg);
  free(px);
}
END_TEST

START_TEST(truncated_and_garbage_files_are_refused) {
  uint8_t *px = flat_rgb(16, 16, 50, 100, 150);
  for (int i = 0; i < 16 * 16 * 3; i++)
    px[i] = (uint8_t)(px[i] + i * 7); /* texture, so the data is not tiny */
  write_png(tmp_path("t.png"), px, 16, 16, 3);
  write_jpeg(tmp_path("t.jpg"), px, 16, 16, 3, 90);
  size_t plen, jlen;
  uint8_t *png = read_file(tmp_path("t.png"), &plen);
  uint8_t *jpg = read_file(tmp_path("t.jpg"), &jlen);
  char why[256];
  float out[16 * 16 * 3];
  /* cut in the image data: the header still reads, the decode must fail */
  ck_assert_int_eq(td_image_decode(out, 3, 16, 16, png, plen - 30, "t.png", why, sizeof why),
                   TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "t.png: bad PNG"));
  ck_assert_int_eq(td_image_decode(out, 3, 16, 16, jpg, jlen / 2, "t.jpg", why, sizeof why),
                   TD_ECORRUPT);
  ck_assert_msg(strstr(why, "t.jpg: bad JPEG") != NULL, "%s", why);
  for (size_t cut = 0; cut < 40; cut++) /* every header prefix */
    ck_assert_int_eq(td_image_decode(out, 3, 16, 16, png, cut, "t.png", why, sizeof why),
                     TD_ECORRUPT);
  const uint8_t text[] = "label,x\n1,2\n";
  ck_assert_int_eq(td_image_decode(out, 3, 16, 16, text, sizeof text, "t.csv", why, sizeof why),
                   TD_ECORRUPT);
  ck_assert_ptr_nonnull(strstr(why, "t.csv: neither a PNG nor a JPEG"));
  free(png);
  free(jpg);
  free(px);
}
END_TEST

/* ---- folder datasets -------------------------------------------------------------- */

/* DIR/CLASS/NAME: a flat w x h image of one grey level, PNG or JPEG by name. */
static void put_image(const char *rel, int w, int h, uint8_t level) {
  uint8_t *px = flat_rgb(w, h, level, level, level);
  if (strstr(rel, ".png") != NULL)
    write_png(tmp_path(rel), px, w, h, 3);
  else
    write_jpeg(tmp_path(rel), px, w, h, 3, 95);
  free(px);
}

/* Three classes (named so their sorted order differs from creation order),
 * n images each, level = 60 * (class + 1), PNG and JPEG mixed. */
static void make_set(const char *dir, int n) {
  static const char *const classes[3] = {"cat", "ant", "bee"}; /* ids: ant 0, bee 1, cat 2 */
  char rel[256];
  make_dir(dir);
  for (int c = 0; c < 3; c++) {
    snprintf(rel, sizeof rel, "%s/%s", dir, classes[c]);
    make_dir(rel);
    int id = c == 0 ? 2 : c - 1;
    for (int i = 0; i < n; i++) {
      snprintf(rel, sizeof rel, "%s/%s/%02d.%s", dir, classes[c], i, i % 2 ? "jpg" : "png");
      put_image(rel, 4, 4, (uint8_t)(60 * (id + 1)));
    }
  }
}

static int class_of(const float *row) { return (int)(row[0] * 255.0f / 60.0f + 0.5f) - 1; }

START_TEST(a_folder_per_class_with_every_fifth_file_held_out) {
  make_set("set", 7);
  td_dataset_t *train = NULL, *test = NULL;
  char why[256];
  td_image_shape_t shape = {.channels = 1, .height = 4, .width = 4};
  ck_assert_msg(td_dataset_load_images(&train, &test, tmp_path("set"), NULL, &shape, why,
                                       sizeof why) == 0,
                "%s", why);
  ck_assert_ptr_nonnull(test);
  /* 7 files per class: index 4 goes to test, the other 6 to train */
  ck_assert_uint_eq(td_dataset_rows(train), 18);
  ck_assert_uint_eq(td_dataset_rows(test), 3);
  ck_assert_uint_eq(td_dataset_dim(train), 16);
  ck_assert_int_eq(td_dataset_classes(train), 3);
  ck_assert_int_eq(td_dataset_classes(test), 3);
  for (size_t r = 0; r < 18; r++) {
    ck_assert_int_eq(td_dataset_labels(train)[r], (int)(r / 6)); /* sorted: ant, bee, cat */
    ck_assert_int_eq(class_of(td_dataset_features(train) + r * 16), td_dataset_labels(train)[r]);
  }
  for (size_t r = 0; r < 3; r++)
    ck_assert_int_eq(td_dataset_labels(test)[r], (int)r);
  td_dataset_close(&train);
  td_dataset_close(&test);
}
END_TEST

START_TEST(a_test_dir_and_the_spec_form) {
  make_set("train", 3);
  make_set("test", 2);
  td_dataset_t *train = NULL, *test = NULL;
  char why[1200], spec[1100];
  snprintf(spec, sizeof spec, "images:%s,%s", tmp_path("train"), tmp_path("test"));
  td_image_shape_t shape = {.channels = 3, .height = 4, .width = 4};
  ck_assert_msg(td_dataset_open_as(&train, &test, spec, &shape, why, sizeof why) == 0, "%s", why);
  ck_assert_uint_eq(td_dataset_rows(train), 9);
  ck_assert_uint_eq(td_dataset_rows(test), 6);
  ck_assert_uint_eq(td_dataset_dim(test), 48);
  for (size_t r = 0; r < 6; r++)
    ck_assert_int_eq(td_dataset_labels(test)[r], (int)(r / 2));
  td_dataset_close(&train);
  td_dataset_close(&test);
  /* no shape: taken from the files (4x4, and RGB because PNGs were written as RGB) */
  ck_assert_int_eq(td_dataset_open(&train, &test, spec, why, sizeof why), 0);
  ck_assert_uint_eq(td_dataset_dim(train), 48);
  td_dataset_close(&train);
  td_dataset_close(&test);
}
END_TEST

START_TEST(folder_refusals_name_the_file) {
  td_dataset_t *train = NULL, *test = NULL;
  char why[1200];
  td_image_shape_t shape = {.channels = 1, .height = 4, .width = 4};
  make_set("set", 2);
  /* a picture of another size */
  put_image("set/bee/zz.png", 5, 4, 10);
  ck_assert_int_eq(td_dataset_load_images(&train, &test, tmp_path("set"), NULL, &shape, why,
                                          sizeof why),
                   TD_ESHAPE);
  ck_assert_msg(strstr(why, "set/bee/zz.png: 5x4 pixels, but the model reads 4x4") != NULL, "%s",
                why);
  ck_assert_ptr_null(train);
  unlink(tmp_path("set/bee/zz.png"));
  /* a symbolic link */
  ck_assert_int_eq(symlink("/etc/passwd", tmp_path("set/bee/link.png")), 0);
  ck_assert_int_eq(td_dataset_load_images(&train, &test, tmp_path("set"), NULL, &shape, why,
                                          sizeof why),
                   TD_EIO);
  ck_assert_msg(strstr(why, "set/bee/link.png is a symbolic link") != NULL, "%s", why);
  unlink(tmp_path("set/bee/link.png"));
  /* a stray file at the top */
  write_bytes(tmp_path("set/README"), (const uint8_t *)"x", 1);
  ck_assert_int_eq(td_dataset_load_images(&train, &test, tmp_path("set"), NULL, &shape, why,
                                          sizeof why),
                   TD_ECORRUPT);
  ck_assert_msg(strstr(why, "set/README is not a folder") != NULL, "%s", why);
  unlink(tmp_path("set/README"));
  /* a file that is no image */
  write_bytes(tmp_path("set/ant/notes.png"), (const uint8_t *)"hello", 5);
  ck_assert_int_eq(td_dataset_load_images(&train, &test, tmp_path("set"), NULL, &shape, why,
                                          sizeof why),
                   TD_ECORRUPT);
  ck_assert_msg(strstr(why, "set/ant/notes.png: neither a PNG nor a JPEG") != NULL, "%s", why);
  unlink(tmp_path("set/ant/notes.png"));
  /* hidden files are skipped */
  write_bytes(tmp_path("set/ant/.DS_Store"), (const uint8_t *)"junk", 4);
  ck_assert_int_eq(td_dataset_load_images(&train, &test, tmp_path("set"), NULL, &shape, why,
                                          sizeof why),
                   0);
  td_dataset_close(&train);
  td_dataset_close(&test);
  /* a TEST_DIR whose classes differ */
  make_dir("other");
  make_dir("other/ant");
  make_dir("other/dog");
  put_image("other/ant/a.png", 4, 4, 1);
  put_image("other/dog/a.png", 4, 4, 1);
  ck_assert_int_eq(td_dataset_load_images(&train, &test, tmp_path("set"), tmp_path("other"),
                                          &shape, why, sizeof why),
                   TD_ESHAPE);
  ck_assert_msg(strstr(why, "the class folders differ") != NULL, "%s", why);
  /* a model with 2 channels cannot read images */
  td_image_shape_t two = {.channels = 2, .height = 4, .width = 4};
  ck_assert_int_eq(td_dataset_load_images(&train, &test, tmp_path("set"), NULL, &two, why,
                                          sizeof why),
                   TD_ESHAPE);
  /* an empty class folder, and a missing DIR */
  make_dir("set/dog");
  ck_assert_int_eq(td_dataset_load_images(&train, &test, tmp_path("set"), NULL, &shape, why,
                                          sizeof why),
                   TD_ECORRUPT);
  ck_assert_msg(strstr(why, "set/dog holds no images") != NULL, "%s", why);
  ck_assert_int_eq(td_dataset_load_images(&train, &test, tmp_path("nowhere"), NULL, &shape, why,
                                          sizeof why),
                   TD_ENOENT);
  ck_assert_ptr_null(train);
  ck_assert_ptr_null(test);
}
END_TEST

/* A file listed as regular and swapped for a link before it is read. */
START_TEST(a_link_swapped_in_after_the_listing_is_not_followed) {
  put_image("x.png", 4, 4, 1);
  ck_assert_int_eq(symlink(tmp_path("x.png"), tmp_path("y.png")), 0);
  uint8_t *bytes = NULL;
  size_t len = 0;
  char why[1200];
  ck_assert_int_eq(
      td_file_read_all_nofollow(tmp_path("y.png"), 1 << 20, &bytes, &len, why, sizeof why),
      TD_EIO);
  ck_assert_msg(strstr(why, "y.png: it is a symbolic link") != NULL, "%s", why);
  ck_assert_ptr_null(bytes);
  ck_assert_int_eq(
      td_file_read_all_nofollow(tmp_path("x.png"), 1 << 20, &bytes, &len, why, sizeof why), 0);
  ck_assert_int_eq(td_image_sniff(bytes, len), TD_IMAGE_PNG);
  free(bytes);
}
END_TEST

static Suite *images_suite(void) {
  Suite *s = suite_create("images");
  TCase *decode = tcase_create("decode");
  tcase_add_checked_fixture(decode, make_tmp_dir, remove_tmp_dir);
  tcase_add_test(decode, png_grey_reads_back_exactly);
  tcase_add_test(decode, png_rgb_reads_back_channels_first);
  tcase_add_test(decode, png_alpha_is_composited_onto_black);
  tcase_add_test(decode, jpeg_flat_colours_read_back_within_the_loss);
  tcase_add_test(decode, jpeg_grey_reads_as_grey_and_as_rgb);
  tcase_add_test(decode, a_size_other_than_the_wanted_one_is_refused);
  tcase_add_test(decode, bombs_are_refused_from_the_header);
  tcase_add_test(decode, truncated_and_garbage_files_are_refused);
  suite_add_tcase(s, decode);
  TCase *folders = tcase_create("folders");
  tcase_add_checked_fixture(folders, make_tmp_dir, remove_tmp_dir);
  tcase_set_timeout(folders, 60);
  tcase_add_test(folders, a_folder_per_class_with_every_fifth_file_held_out);
  tcase_add_test(folders, a_test_dir_and_the_spec_form);
  tcase_add_test(folders, folder_refusals_name_the_file);
  tcase_add_test(folders, a_link_swapped_in_after_the_listing_is_not_followed);
  suite_add_tcase(s, folders);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(images_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
