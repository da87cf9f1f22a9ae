#!/usr/bin/env bash
# standalone_bad_input.sh: every kind of bad input gets one line on stderr and
# a non-zero exit, never a crash: missing dataset (names the path and the
# Debian package), truncated and corrupt IDX/gz files, dimensions that do not
# fit the model, unknown or out-of-range keys, a bad INI file, NaN loss.
. "${top_srcdir:-.}/tests/integration/lib.sh"
FM=/usr/share/datasets/fashion-mnist

TRAIND_FASHION_MNIST_DIR="$T/nowhere" run missing "$TRAIND" --standalone
expect_error missing "$T/nowhere/.*dataset-fashion-mnist"

run no_mode "$TRAIND" --set batch=1
expect_error no_mode "trainctl start"
run unknown_key "$TRAIND" --standalone --set bogus=1
expect_error unknown_key "unknown key 'bogus'"
run bad_batch "$TRAIND" --standalone --set batch=0
expect_error bad_batch "batch: 0 is out of range"
run bad_lr "$TRAIND" --standalone --set lr=nan
expect_error bad_lr "lr: 'nan' is not a finite number"
run bad_model "$TRAIND" --standalone --set model=mlp:784-x-10
expect_error bad_model "model:"
run bad_partition "$TRAIND" --standalone --set partition=dirichlet:-1
expect_error bad_partition "partition:"
run missing_ini "$TRAIND" --standalone "$T/none.ini"
expect_error missing_ini "none.ini"
printf 'batch = 64\nnot a key value line\n' >"$T/bad.ini"
run bad_ini "$TRAIND" --standalone "$T/bad.ini"
expect_error bad_ini "bad.ini:2"
run bad_arg "$TRAIND" --standalone --frobnicate
expect_error bad_arg "bad arguments"

# A tiny valid IDX pair (8 images of 2x2, labels) built byte by byte.
idx_images() { printf '\x00\x00\x08\x03\x00\x00\x00\x08\x00\x00\x00\x02\x00\x00\x00\x02'; awk 'BEGIN { for (i = 0; i < 32; i++) printf "%c", 40 + (i * 7) % 80 }'; }
idx_labels() { printf '\x00\x00\x08\x01\x00\x00\x00\x08\x00\x01\x02\x03\x00\x01\x02\x03'; }
idx_images >"$T/img.idx"; idx_labels >"$T/lab.idx"
run idx_ok "$TRAIND" --standalone --set dataset=idx:$T/img.idx,$T/lab.idx --set model=mlp:4-8-4 --set batch=4
[ "$(rc_of idx_ok)" -eq 0 ] && pass "a valid hand-made IDX pair trains" || { fail "idx_ok"; cat "$T/idx_ok.err"; }

# dims that do not fit the model
run dims "$TRAIND" --standalone --set dataset=idx:$T/img.idx,$T/lab.idx --set model=mlp:784-8-10
expect_error dims "4 features.*input width is 784"
run classes "$TRAIND" --standalone --set dataset=idx:$T/img.idx,$T/lab.idx --set model=mlp:4-8-2
expect_error classes "4 classes.*2 outputs"

# truncated: header promises 8 images, data holds 7
idx_images | head -c 44 >"$T/short.idx"
run truncated "$TRAIND" --standalone --set dataset=idx:$T/short.idx,$T/lab.idx --set model=mlp:4-8-4
expect_error truncated "truncated|corrupt"
# wrong magic
printf '\x01\x02\x08\x03' >"$T/magic.idx"
run magic "$TRAIND" --standalone --set dataset=idx:$T/magic.idx,$T/lab.idx --set model=mlp:4-8-4
expect_error magic "magic|IDX|corrupt"
# hostile header: 2^31 x 2^31 items
printf '\x00\x00\x08\x03\x7f\xff\xff\xff\x7f\xff\xff\xff\x00\x00\x00\x01' >"$T/huge.idx"
run huge "$TRAIND" --standalone --set dataset=idx:$T/huge.idx,$T/lab.idx --set model=mlp:4-8-4
expect_error huge "limit|large|corrupt|truncated"
# label count differs from image count
printf '\x00\x00\x08\x01\x00\x00\x00\x05\x00\x01\x02\x03\x00' >"$T/lab5.idx"
run count "$TRAIND" --standalone --set dataset=idx:$T/img.idx,$T/lab5.idx --set model=mlp:4-8-4
expect_error count "8.*5|5.*8|count|labels"

if [ -r "$FM/t10k-images-idx3-ubyte.gz" ]; then
  # truncated gzip of the real file, and a gzip with flipped bytes in its body
  head -c 2000000 "$FM/t10k-images-idx3-ubyte.gz" >"$T/trunc.gz"
  run trunc_gz "$TRAIND" --standalone --set "dataset=idx:$T/trunc.gz,$FM/t10k-labels-idx1-ubyte.gz"
  expect_error trunc_gz "truncated|corrupt"
  cp "$FM/t10k-images-idx3-ubyte.gz" "$T/flip.gz"
  printf '\xde\xad\xbe\xef\xde\xad\xbe\xef' | dd of="$T/flip.gz" bs=1 seek=100000 conv=notrunc 2>/dev/null
  run corrupt_gz "$TRAIND" --standalone --set "dataset=idx:$T/flip.gz,$FM/t10k-labels-idx1-ubyte.gz"
  expect_error corrupt_gz "corrupt|truncated|gzip"
else
  echo "note: $FM missing; gzip corruption cases use the hand-made file only"
fi
gzip -c "$T/img.idx" | head -c 30 >"$T/small_trunc.gz"
run small_trunc_gz "$TRAIND" --standalone --set dataset=idx:$T/small_trunc.gz,$T/lab.idx --set model=mlp:4-8-4
expect_error small_trunc_gz "truncated|corrupt"

# NaN loss: a learning rate that blows up
run nan "$TRAIND" --standalone --set dataset=idx:$T/img.idx,$T/lab.idx --set model=mlp:4-8-4 \
  --set batch=4 --set lr=1e30 --set epochs=20
expect_error nan "not finite"
finish
