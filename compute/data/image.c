/* image.c: PNG (libpng's simplified API) and JPEG (libjpeg-turbo) decoding
 * into channels-first float features (image.h).
 *
 * Both libraries read from the caller's buffer, so a lying length inside a
 * file can at most make them ask for bytes that are not there, which they
 * report as truncation. libpng's simplified API catches its own errors and
 * returns 0 with a message; libjpeg reports errors by calling error_exit,
 * which here long-jumps back to the decode with the library's message, and
 * its warnings (corrupt data, a premature end that it would otherwise fill
 * with grey) are made errors too. A progressive JPEG may make libjpeg do a
 * pass per scan, so the number of scans is bounded as well as the size. */
#include "compute/data/image.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>

#include "common/error.h"

/* A real JPEG has at most a few dozen scans; thousands of tiny ones only
 * serve to make the decoder loop. */
#define TD__JPEG_MAX_SCANS 256
/* libjpeg's working memory for one image: the coefficient buffer of a
 * progressive TD_IMAGE_MAX_PIXELS image is about 6 MiB. */
#define TD__JPEG_MAX_MEMORY ((long)64 << 20)

int td_image_sniff(const uint8_t *bytes, size_t len) {
  static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (len >= 8 && memcmp(bytes, png_magic, 8) == 0)
    return TD_IMAGE_PNG;
  if (len >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff)
    return TD_IMAGE_JPEG;
  return 0;
}

static int check_size(const char *name, const char *kind, uint32_t width, uint32_t height,
                      char *why, size_t why_len) {
  if (width == 0 || height == 0 || width > TD_IMAGE_MAX_SIDE || height > TD_IMAGE_MAX_SIDE ||
      (uint64_t)width * height > TD_IMAGE_MAX_PIXELS)
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: %s declares %ux%u pixels, beyond the limit (sides up to %u, %u pixels "
                  "in all)",
                  name, kind, width, height, TD_IMAGE_MAX_SIDE, TD_IMAGE_MAX_PIXELS);
  return 0;
}

/* ---- PNG ------------------------------------------------------------------------ */

static int png_begin(png_image *img, const uint8_t *bytes, size_t len, const char *name, char *why,
                     size_t why_len) {
  memset(img, 0, sizeof *img);
  img->version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(img, bytes, len)) {
    int rc = td_why(why, why_len, TD_ECORRUPT, "%s: bad PNG: %s", name, img->message);
    png_image_free(img);
    return rc;
  }
  int rc = check_size(name, "PNG", img->width, img->height, why, why_len);
  if (rc != 0)
    png_image_free(img);
  return rc;
}

/* Decode into pixels (interleaved, channels bytes per pixel). */
static int png_decode(uint8_t *pixels, int channels, const uint8_t *bytes, size_t len,
                      const char *name, char *why, size_t why_len) {
  png_image img;
  int rc = png_begin(&img, bytes, len, name, why, why_len);
  if (rc != 0)
    return rc;
  img.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  static const png_color black = {0, 0, 0};
  if (!png_image_finish_read(&img, &black, pixels, 0, NULL)) {
    rc = td_why(why, why_len, TD_ECORRUPT, "%s: bad PNG: %s", name, img.message);
    png_image_free(&img);
    return rc;
  }
  /* libpng's simplified reader stops after the image data; a warning (say a
   * bad CRC in a later chunk) is in the message but does not fail the read */
  return 0;
}

/* ---- JPEG ----------------------------------------------------------------------- */

typedef struct {
  struct jpeg_error_mgr pub;
  struct jpeg_progress_mgr progress;
  jmp_buf escape;
  char message[JMSG_LENGTH_MAX];
} jpeg_guard_t;

static void jpeg_fail(j_common_ptr cinfo) {
  jpeg_guard_t *g = (jpeg_guard_t *)cinfo->err;
  (*cinfo->err->format_message)(cinfo, g->message);
  longjmp(g->escape, 1);
}

/* Warnings (level -1) are corrupt data: refused. Trace messages are ignored. */
static void jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0)
    jpeg_fail(cinfo);
}

static void jpeg_progress(j_common_ptr cinfo) {
  if (cinfo->is_decompressor && ((j_decompress_ptr)cinfo)->input_scan_number > TD__JPEG_MAX_SCANS) {
    jpeg_guard_t *g = (jpeg_guard_t *)cinfo->err;
    snprintf(g->message, sizeof g->message, "more than %d scans", TD__JPEG_MAX_SCANS);
    longjmp(g->escape, 1);
  }
}

/* Set up cinfo with the error, warning and scan guards, the memory cap and
 * bytes as its source, and read the header (errors long-jump to g). */
static void jpeg_header_of(struct jpeg_decompress_struct *cinfo, jpeg_guard_t *g,
                           const uint8_t *bytes, size_t len) {
  cinfo->err = jpeg_std_error(&g->pub);
  g->pub.error_exit = jpeg_fail;
  g->pub.emit_message = jpeg_message;
  jpeg_create_decompress(cinfo);
  cinfo->mem->max_memory_to_use = TD__JPEG_MAX_MEMORY;
  g->progress.progress_monitor = jpeg_progress;
  cinfo->progress = &g->progress;
  jpeg_mem_src(cinfo, bytes, (unsigned long)len);
  jpeg_read_header(cinfo, TRUE);
}

/* Whether libjpeg can give grey and RGB from it: not CMYK, YCCK or two components. */
static int jpeg_color_ok(const struct jpeg_decompress_struct *cinfo) {
  return (cinfo->jpeg_color_space == JCS_GRAYSCALE && cinfo->num_components == 1) ||
         ((cinfo->jpeg_color_space == JCS_YCbCr || cinfo->jpeg_color_space == JCS_RGB) &&
          cinfo->num_components == 3);
}

/* The state a longjmp must find intact lives in one struct that the decode
 * reaches through a pointer, so nothing the escape needs is a local that
 * setjmp's caller modified. */
typedef struct {
  struct jpeg_decompress_struct cinfo;
  jpeg_guard_t guard;
} jpeg_job_t;

static int jpeg_decode(uint8_t *pixels, int channels, const uint8_t *bytes, size_t len,
                       const char *name, char *why, size_t why_len) {
  jpeg_job_t *job = calloc(1, sizeof *job);
  if (job == NULL)
    return td_why(why, why_len, TD_ENOMEM, "%s: out of memory", name);
  int rc = 0;
  if (setjmp(job->guard.escape)) {
    rc = td_why(why, why_len, TD_ECORRUPT, "%s: bad JPEG: %s", name, job->guard.message);
    goto done;
  }
  jpeg_header_of(&job->cinfo, &job->guard, bytes, len);
  if ((rc = check_size(name, "JPEG", job->cinfo.image_width, job->cinfo.image_height, why,
                       why_len)) != 0)
    goto done;
  if (!jpeg_color_ok(&job->cinfo)) {
    rc = td_why(why, why_len, TD_ECORRUPT, "%s: JPEG is neither greyscale nor RGB/YCbCr", name);
    goto done;
  }
  job->cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&job->cinfo);
  size_t stride = (size_t)job->cinfo.output_width * (size_t)channels;
  while (job->cinfo.output_scanline < job->cinfo.output_height) {
    JSAMPROW row = pixels + (size_t)job->cinfo.output_scanline * stride;
    if (jpeg_read_scanlines(&job->cinfo, &row, 1) != 1) {
      rc = td_why(why, why_len, TD_ECORRUPT, "%s: bad JPEG: no data for row %u", name,
                  job->cinfo.output_scanline);
      goto done;
    }
  }
  jpeg_finish_decompress(&job->cinfo);
done:
  jpeg_destroy_decompress(&job->cinfo);
  free(job);
  return rc;
}

static int jpeg_probe(td_image_info_t *info, const uint8_t *bytes, size_t len, const char *name,
                      char *why, size_t why_len) {
  jpeg_job_t *job = calloc(1, sizeof *job);
  if (job == NULL)
    return td_why(why, why_len, TD_ENOMEM, "%s: out of memory", name);
  int rc = 0;
  if (setjmp(job->guard.escape)) {
    rc = td_why(why, why_len, TD_ECORRUPT, "%s: bad JPEG: %s", name, job->guard.message);
    goto done;
  }
  jpeg_header_of(&job->cinfo, &job->guard, bytes, len);
  info->width = job->cinfo.image_width;
  info->height = job->cinfo.image_height;
  info->color = job->cinfo.num_components == 3;
  rc = check_size(name, "JPEG", info->width, info->height, why, why_len);
  if (rc == 0 && !jpeg_color_ok(&job->cinfo))
    rc = td_why(why, why_len, TD_ECORRUPT,
                "%s: JPEG with %d components in colour space %d; only greyscale and RGB/YCbCr "
                "JPEGs are read (convert CMYK images to RGB)",
                name, job->cinfo.num_components, (int)job->cinfo.jpeg_color_space);
done:
  jpeg_destroy_decompress(&job->cinfo);
  free(job);
  return rc;
}

/* ---- the interface ------------------------------------------------------------- */

int td_image_probe(td_image_info_t *info, const uint8_t *bytes, size_t len, const char *name,
                   char *why, size_t why_len) {
  memset(info, 0, sizeof *info);
  int format = td_image_sniff(bytes, len);
  info->format = (td_image_format_t)format;
  if (format == TD_IMAGE_JPEG)
    return jpeg_probe(info, bytes, len, name, why, why_len);
  if (format != TD_IMAGE_PNG)
    return td_why(why, why_len, TD_ECORRUPT,
                  "%s: neither a PNG nor a JPEG (judged by its first bytes)", name);
  png_image img;
  int rc = png_begin(&img, bytes, len, name, why, why_len);
  if (rc != 0)
    return rc;
  info->width = img.width;
  info->height = img.height;
  info->color = (img.format & PNG_FORMAT_FLAG_COLOR) != 0;
  png_image_free(&img);
  return 0;
}

int td_image_decode(float *out, int channels, uint32_t width, uint32_t height, const uint8_t *bytes,
                    size_t len, const char *name, char *why, size_t why_len) {
  if (channels != 1 && channels != 3)
    return td_why(why, why_len, TD_EINVAL, "%s: images decode to 1 or 3 channels, not %d", name,
                  channels);
  td_image_info_t info;
  int rc = td_image_probe(&info, bytes, len, name, why, why_len);
  if (rc != 0)
    return rc;
  if (info.width != width || info.height != height)
    return td_why(why, why_len, TD_ESHAPE,
                  "%s: %ux%u pixels, but the dataset's images are %ux%u (width x height); "
                  "resize the images first (nothing is resized here)",
                  name, info.width, info.height, width, height);
  size_t plane = (size_t)width * height;
  uint8_t *pixels = malloc(plane * (size_t)channels);
  if (pixels == NULL)
    return td_why(why, why_len, TD_ENOMEM, "%s: out of memory for %ux%u pixels", name, width,
                  height);
  rc = info.format == TD_IMAGE_PNG ? png_decode(pixels, channels, bytes, len, name, why, why_len)
                                   : jpeg_decode(pixels, channels, bytes, len, name, why, why_len);
  if (rc == 0)
    for (int c = 0; c < channels; c++)
      for (size_t i = 0; i < plane; i++)
        out[(size_t)c * plane + i] = (float)pixels[i * (size_t)channels + (size_t)c] / 255.0f;
  free(pixels);
  return rc;
}
