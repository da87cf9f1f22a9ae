#!/usr/bin/env bash
# cluster_images.sh: the file datasets a new user brings, end to end.
#  - images:DIR: td_mkimages writes 3 classes x 100 RGB 16x16 images (half
#    PNG, half JPEG) separable by colour; 3 nodes with --data-root train a
#    small CNN on them (the test split is every fifth file of each class)
#    and every node reaches a test accuracy >= 0.9 (the images are made so
#    that a CNN gets about 0.98);
#  - the same folder on one node with an mlp (flat input: the images are
#    taken at their own size, RGB) and refused with one line for the cnn,
#    whose input(1,28,28) is not 16x16;
#  - npy:X,Y,TX,TY written by NumPy (float32 X, int64 Y) on one node
#    (standalone): test accuracy >= 0.9;
#  - `trainctl start` refuses with one line naming the file: the cnn (its
#    input(1,28,28) is not 16x16), and hostile files in a class folder: a PNG whose header declares 60000x60000 pixels, a
#    truncated JPEG, and a symbolic link out of the data root.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
MKIMAGES="${top_builddir:-$(pwd)}/tests/integration/td_mkimages"

mkdir -p "$T/data"
"$MKIMAGES" "$T/data/img" 100 16 7 || { fail "td_mkimages"; finish; }
n_png=$(find "$T/data/img" -name '*.png' | wc -l)
n_jpg=$(find "$T/data/img" -name '*.jpg' | wc -l)
[ "$n_png" = 150 ] && [ "$n_jpg" = 150 ] && pass "dataset: 150 PNG and 150 JPEG in 3 class folders" \
  || fail "dataset: $n_png PNG, $n_jpg JPEG"

CNN='layers:input(3,16,16) conv(8,3,pad=1) relu maxpool(2) flatten dense(3)'
for n in a b c; do start_node $n --data-root "$T/data" || finish; done
ctl b join "$(endpoint_of a)" >/dev/null || fail "b join a"
ctl c join "$(endpoint_of a)" >/dev/null || fail "c join a"
for n in a b c; do wait_peers $n 2 15 || fail "$n does not see 2 alive peers"; done

out=$(ctl a start --set dataset=images:img --set "model=$CNN" --set batch=16 --set lr=0.05 \
  --set momentum=0.9 --set epochs=8 --set local_steps=2 --set seed=5 2>&1) || fail "start: $out"
pass "$out"
for n in a b c; do wait_run_state $n finished 120 || fail "$n did not finish"; done
for n in a b c; do
  acc=$(json_field "$(ctl $n status --json)" test_accuracy)
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' && pass "$n: images test accuracy $acc >= 0.9" \
    || fail "$n: images test accuracy $acc < 0.9"
done

# one node: an mlp reads the images flat at their own size (16x16 RGB: 768)
run mlp "$TRAIND" --standalone --json --set "dataset=images:$T/data/img" --set model=mlp:768-32-3 \
  --set batch=16 --set lr=0.05 --set epochs=4 --set threads=1
acc=$(json_field "$(tail -n1 "$T/mlp.out")" test_accuracy)
[ "$(rc_of mlp)" = 0 ] && awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' \
  && pass "standalone mlp on the images: test accuracy $acc" \
  || { fail "standalone mlp on the images: exit $(rc_of mlp), accuracy $acc"; cat "$T/mlp.err"; }
run cnn28 "$TRAIND" --standalone --set "dataset=images:$T/data/img" --set model=cnn --set epochs=1
[ "$(rc_of cnn28)" = 1 ] && [ "$(wc -l <"$T/cnn28.err")" = 1 ] &&
  grep -q "img/blue/0000.png: 16x16 pixels, but the model reads 28x28 (width x height); resize" \
    "$T/cnn28.err" && pass "cnn on 16x16 images: $(cat "$T/cnn28.err")" \
  || { fail "cnn on 16x16 images: exit $(rc_of cnn28)"; cat "$T/cnn28.err"; }

# npy on one node, written by NumPy: 3 Gaussian blobs in 4 dimensions
if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  (cd "$T/data" && /usr/bin/python3 -c '
import numpy as np
r = np.random.default_rng(3)
centres = np.array([[2, 0, 0, 0], [0, 2, 0, 0], [0, 0, 2, 0]], np.float32)
for name, n in (("train", 600), ("test", 150)):
    y = r.integers(0, 3, n)
    x = (centres[y] + r.normal(0, 0.5, (n, 4))).astype(np.float32)
    np.save(name + "_x.npy", x)
    np.save(name + "_y.npy", y.astype(np.int64))
') || fail "numpy could not write the npy files"
  D=$T/data
  run npy "$TRAIND" --standalone --json \
    --set "dataset=npy:$D/train_x.npy,$D/train_y.npy,$D/test_x.npy,$D/test_y.npy" \
    --set model=mlp:4-16-3 --set batch=16 --set lr=0.05 --set epochs=5 --set threads=1
  acc=$(json_field "$(tail -n1 "$T/npy.out")" test_accuracy)
  [ "$(rc_of npy)" = 0 ] && awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' \
    && pass "npy on one node: test accuracy $acc >= 0.9" \
    || { fail "npy on one node: exit $(rc_of npy), accuracy $acc"; cat "$T/npy.err"; }
else
  pass "npy run skipped: /usr/bin/python3 has no numpy (Debian: python3-numpy)"
fi

# hostile files: each refused by start with one line naming it
hostile() { # NAME FILE EXPECTED-TEXT
  local name=$1 file=$2 want=$3
  run "$name" ctl a start --set dataset=images:img --set "model=$CNN" --set epochs=1
  if [ "$(rc_of "$name")" = 1 ] && [ "$(wc -l <"$T/$name.err")" = 1 ] &&
     grep -qF "$want" "$T/$name.err"; then
    pass "$name: $(cat "$T/$name.err")"
  else
    fail "$name: exit $(rc_of "$name"), stderr:"; cat "$T/$name.err"
  fi
  rm -f "$file"
}
# a peer run converts to the model's input too: cnn reads 1x28x28
run cnn_peer ctl a start --set dataset=images:img --set model=cnn --set epochs=1
[ "$(rc_of cnn_peer)" = 1 ] && [ "$(wc -l <"$T/cnn_peer.err")" = 1 ] &&
  grep -q "img/blue/0000.png: 16x16 pixels, but the model reads 28x28" "$T/cnn_peer.err" \
  && pass "cnn_peer: $(cat "$T/cnn_peer.err")" \
  || { fail "cnn_peer: exit $(rc_of cnn_peer)"; cat "$T/cnn_peer.err"; }
good=$T/data/img/red/0000.png
python3 -c '
import struct, sys, zlib
b = bytearray(open(sys.argv[1], "rb").read())
b[16:24] = struct.pack(">II", 60000, 60000)
b[29:33] = struct.pack(">I", zlib.crc32(bytes(b[12:29])))
open(sys.argv[2], "wb").write(b)' "$good" "$T/data/img/red/bomb.png"
hostile bomb "$T/data/img/red/bomb.png" \
  "img/red/bomb.png: PNG declares 60000x60000 pixels, beyond the limit"
head -c 300 "$T/data/img/green/0001.jpg" >"$T/data/img/green/cut.jpg"
hostile truncated "$T/data/img/green/cut.jpg" "img/green/cut.jpg: bad JPEG: Premature end of JPEG file"
echo secret >"$T/outside.png"
ln -s "$T/outside.png" "$T/data/img/blue/link.png"
hostile symlink "$T/data/img/blue/link.png" "img/blue/link.png is a symbolic link"
finish
