/* codec.h: update compression — codec specs, per-link encoders, and the one
 * decoder of compressed update messages.
 *
 * A message carries one record per tensor of the model's layout (a message
 * of a range of the flat buffer, fragments' slices: one per tensor the range
 * touches, numel then being the length of that tensor's part):
 *   u32 tensor_id | u8 codec | u8 codec_version | u16 flags | u32 numel |
 *   u32 payload_bytes | payload            (little-endian, 16-byte header)
 * 1-D tensors and tensors under TD_CODEC_MIN_NUMEL elements travel dense
 * (docs/algorithms.md#conventions-shared-by-the-codecs): fp32 under none,
 * fp16 under every lossy codec, since in fp32 a gpt's biases and norm gains
 * were half of a sparse top-k message (bench/RESULTS.md); under an
 * error-feedback codec their rounding error stays in the link's residual.
 * Error-feedback residuals belong to the link (td_link_codec_t, one per peer),
 * not to the codec, so every link can carry its own codec later. The decoder
 * checks every size against the layout and the codec's bound before touching
 * memory and refuses NaN/Inf; it never trusts the sender. */
#ifndef TD_CODEC_H
#define TD_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compute/params.h"

#define TD_CODEC_HEADER_BYTES 16
#define TD_CODEC_MIN_NUMEL 1024

/* Wire ids of the built-in codecs (each codec's file sets its own; these
 * names are for the code that picks a codec, like codec = auto). */
typedef enum {
  TD_CODEC_NONE = 0,
  TD_CODEC_FP16 = 1,
  TD_CODEC_TERNARY = 2,
  TD_CODEC_TOPK = 3,
  TD_CODEC_POWERSGD = 4,
  TD_CODEC_QSGD = 5,
} td_codec_id_t;

/* Ternary's default clip, in standard deviations. */
#define TD_CODEC_CLIP_SIGMA 2.5

typedef struct {
  td_codec_id_t id;
  double density;  /* topk: fraction of entries sent, (0, 1] */
  unsigned rank;   /* powersgd: rank, >= 1 */
  unsigned levels; /* qsgd: quantization levels s, 1..127 */
  bool base3;      /* ternary: 5 trits per byte instead of 4 x 2 bits */
  double clip;     /* ternary: clip at clip * sigma (TD_CODEC_CLIP_SIGMA) */
} td_codec_spec_t;

/* Parse NAME[:ARG] by the named codec's own parser: none | fp16 |
 * ternary[:base3] | topk:DENSITY | powersgd:RANK | qsgd:LEVELS. TD_ECONFIG +
 * a one-line why (an unknown name lists the known ones; a bad parameter is
 * named with its range, "codec topk: density 2 is out of range (0, 1]"). */
int td_codec_parse(td_codec_spec_t *out, const char *text, char *why, size_t why_len);
/* Canonical text of a spec ("topk:0.01"). */
void td_codec_format(const td_codec_spec_t *spec, char *buf, size_t len);
/* "none", "fp16", ... or NULL for an unknown id. */
const char *td_codec_name(unsigned id);
/* Whether text (NAME or NAME:ARG) names a known codec, whatever its ARG. */
bool td_codec_known(const char *text);
/* "none, fp16, ternary[:base3], topk:DENSITY, ...": every codec's syntax. */
void td_codec_list(char *buf, size_t len);
/* Whether the codec keeps an error-feedback residual (top-k, PowerSGD). */
bool td_codec_uses_error_feedback(const td_codec_spec_t *spec);
/* Whether a slice of the model may travel alone on a link of this codec
 * (td_link_codec_encode_range): no residual, or one that splits by range
 * (top-k; PowerSGD's residual and factors follow whole tensors). */
bool td_codec_slices_feedback(const td_codec_spec_t *spec);

/* Largest message any sender can produce for this layout (any codec): the
 * receiver refuses anything larger before buffering it. */
size_t td_codec_message_bound(const td_layout_t *layout);

typedef struct td_link_codec td_link_codec_t;

/* Encoder state of one link: the codec, its residual (EF codecs) and warm
 * starts (PowerSGD's Q), a PRNG stream (seed, link). layout is borrowed and
 * must outlive the encoder. Caller owns *out. */
int td_link_codec_open(td_link_codec_t **out, const td_codec_spec_t *spec,
                       const td_layout_t *layout, uint64_t seed, uint64_t link_id);
void td_link_codec_close(td_link_codec_t **self_p);

/* Encode delta (td_layout_numel floats) into a message. For EF codecs the
 * residual is added first and afterwards holds exactly what was not sent:
 * input + keep x old_residual == decoded + new_residual (up to fp32 rounding;
 * keep is 1 unless td_link_codec_decay_residual set it for this encode).
 * TD_ENUMERIC if delta holds NaN/Inf: nothing is produced and the residual is
 * untouched. *msg is borrowed: valid until the next encode or close. */
int td_link_codec_encode(td_link_codec_t *lc, const float *delta, const uint8_t **msg,
                         size_t *len);
/* Encode only the range [offset, offset + count) of delta (which still
 * spans td_layout_numel floats; only the range is read): one record per
 * tensor the range touches, carrying that tensor's part of it (a part of a
 * tensor is coded as one row of its floats). fragments = P sends each
 * round's slice this way. The whole range is td_link_codec_encode, byte for
 * byte. TD_EINVAL for a range past the layout, or a part of it while the
 * link keeps a residual (an error-feedback codec, or one switched away from:
 * the residual covers the whole model). Otherwise as td_link_codec_encode. */
int td_link_codec_encode_range(td_link_codec_t *lc, const float *delta, size_t offset,
                               size_t count, const uint8_t **msg, size_t *len);
/* How many floats an encode reads from delta (td_layout_numel of its layout). */
size_t td_link_codec_numel(const td_link_codec_t *lc);
/* The residual buffer (td_layout_numel floats), or NULL while the link has
 * never kept one (opened and used with codecs without error feedback). */
const float *td_link_codec_residual(const td_link_codec_t *lc);
/* Frees the message the last encode returned (it is no longer valid); the
 * next encode allocates one again. For a caller that has copied it out and
 * keeps many links. */
void td_link_codec_release_message(td_link_codec_t *lc);
const td_codec_spec_t *td_link_codec_spec(const td_link_codec_t *lc);
/* The next encode (only) scales the residual by keep (in [0, 1); anything
 * else keeps it whole) before adding the delta: the daemon's ef_decay, when
 * the learning rate fell since the link's last encode. */
void td_link_codec_decay_residual(td_link_codec_t *lc, float keep);
/* Switch the link to another codec (codec = auto re-plans every round). The
 * residual stays: an EF codec keeps accumulating into it, and a codec without
 * EF sends it along with the next delta, so nothing held back is lost. */
int td_link_codec_set_spec(td_link_codec_t *lc, const td_codec_spec_t *spec);
/* Upper bound of the message a spec produces for this layout (exact for
 * none and fp16; ternary adds at most its per-tensor scale; top-k counts 5
 * bytes for every index, loose on purpose: codec = auto's top-k then uses
 * about 2/3 of its budget, which measured better than a tight bound,
 * bench/RESULTS.md). */
size_t td_codec_message_size(const td_codec_spec_t *spec, const td_layout_t *layout);
/* codec = auto: the least lossy spec whose message fits budget_bytes, from
 * none, fp16 and top-k (largest density >= 0.0001 that fits). Not ternary:
 * it keeps no residual, so its noise (about the update's own energy) stays
 * in every receiver's model for good and piles up round after round (the
 * gpt's measurement: bench/RESULTS.md). */
void td_codec_fit_budget(const td_layout_t *layout, double budget_bytes, td_codec_spec_t *out);

/* Decode a message into out (td_layout_numel floats, overwritten); every tensor
 * of the layout must be present exactly once. TD_EPROTO + why for anything malformed,
 * inconsistent with the layout or non-finite. *codec_id (optional) gets the
 * codec of the largest tensor, for the ledger. */
int td_codec_decode_message(const td_layout_t *layout, const uint8_t *msg, size_t len,
                            float *out, unsigned *codec_id, char *why, size_t why_len);
/* Decode a message of the range [offset, offset + count) (what
 * td_link_codec_encode_range sent) into out (td_layout_numel floats): the
 * range's floats from the message, every other float 0. Each tensor the
 * range touches must be present once with exactly its part's length, no
 * other tensor at all: a message cut for another range is TD_EPROTO + why,
 * as anything malformed. TD_EINVAL for a range past the layout. */
int td_codec_decode_range(const td_layout_t *layout, size_t offset, size_t count,
                          const uint8_t *msg, size_t len, float *out, unsigned *codec_id,
                          char *why, size_t why_len);

#endif
