#!/bin/bash
# cluster_invite.sh: admission by invite (issue 36, item 2). Twelve nodes
# that list no key at all become one cluster with 12 trainctl commands (one
# `invite --count 11` on the founding node, one `join` on each new node);
# a used invite, an expired invite and forged admissions (a bad signature,
# one signed by a member without admin, a replayed admission of a revoked
# key) are refused, counted and logged; a member without admin can neither
# invite nor spread a revocation; an admin's revocation ends the member on
# every node; an admin admitted by invite admits a node of its own; a join
# whose handshake times out (a listener that takes the connection, says
# nothing and drops it after 4.5 s, as an overloaded node's handshake timer
# does) says so, and is not reported as a wrong key.
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
FORGE="${top_builddir:-$(pwd)}/tests/integration/td_forge"

# start_bare NAME: a node that lists no key (start_node would admit them all).
start_bare() {
  local name=$1 i
  mkdir -p "$T/$name"
  "$TRAIND" --data-dir "$T/$name" --listen tcp://127.0.0.1:0 --control "$T/$name/ctl" \
    --heartbeat-ms 200 --threads 1 --log-level info >>"$T/$name.log" 2>&1 &
  echo $! >"$T/$name.pid"
  NODES+=("$name")
  for i in $(seq 100); do
    [ -S "$T/$name/ctl" ] && [ -s "$T/$name/endpoint" ] && return 0
    sleep 0.1
  done
  fail "$name did not start"
}

admission() { json_field "$(ctl "$1" status --json)" "$2"; }
listed() { grep -c '^[^#]' "$T/$1/allowed_keys" 2>/dev/null || echo 0; }
lists_key() { grep -qF -- "$2" "$T/$1/allowed_keys" 2>/dev/null; }

NAMES=()
for i in $(seq 0 11); do NAMES+=("n$i"); done
for n in "${NAMES[@]}" late later; do start_bare "$n"; done

# ---- 12 nodes, 12 commands --------------------------------------------------------------
commands=0
ctl n0 invite --count 11 >"$T/invites" || fail "invite --count 11"
commands=$((commands + 1))
[ "$(wc -l <"$T/invites")" -eq 11 ] && pass "invite --count 11 printed 11 join strings" \
  || fail "invite printed $(wc -l <"$T/invites") lines"
grep -q '[^A-Za-z0-9,.:/_-]' "$T/invites" && fail "a join string has shell metacharacters" \
  || pass "the join strings hold only characters a shell takes literally"
[ "$(sort -u "$T/invites" | wc -l)" -eq 11 ] && pass "each join string is a different one-time token" \
  || fail "join strings repeat"
for i in $(seq 1 11); do
  ctl "n$i" join $(sed -n "${i}p" "$T/invites") >/dev/null || fail "n$i join by invite"
  commands=$((commands + 1))
done
[ "$commands" -le 12 ] && pass "12 nodes admitted with $commands commands" || fail "$commands commands"
for n in "${NAMES[@]}"; do
  wait_peers "$n" 11 30 || fail "$n sees $(ctl "$n" peers --json | grep -o '"state":"alive"' | wc -l) alive peers, not 11"
done
ok=0
for n in "${NAMES[@]}"; do [ "$(listed "$n")" -eq 11 ] && ok=$((ok + 1)); done
[ "$ok" -eq 12 ] && pass "every node lists the 11 others and sees them alive" \
  || fail "only $ok of 12 nodes list 11 keys"

# ---- a used invite and an expired one are refused, counted and logged ---------------------
run used "$TRAINCTL" --socket "$T/late/ctl" join "$(sed -n 1p "$T/invites")"
expect_error used "the invite was used already, has expired"
[ "$(admission n0 invites_refused_used)" -ge 1 ] && pass "n0 counted the used invite" \
  || fail "n0 did not count the used invite"
grep -q "invite key .* was used already" "$T/n0.log" && pass "n0 logged the used invite" \
  || fail "no log line for the used invite"
ctl n0 invite --ttl 1s >"$T/short" || fail "invite --ttl 1s"
sleep 2
run expired "$TRAINCTL" --socket "$T/late/ctl" join "$(cat "$T/short")"
expect_error expired "the invite was used already, has expired"
[ "$(admission n0 invites_refused_expired)" -eq 1 ] && pass "n0 counted the expired invite" \
  || fail "n0 counted $(admission n0 invites_refused_expired) expired invites"
grep -q "invite key .* has expired" "$T/n0.log" && pass "n0 logged the expired invite" \
  || fail "no log line for the expired invite"
lists_key n0 "$(key_of late)" && fail "a refused invite admitted its node" \
  || pass "neither refused invite admitted anything"

# a forged join string: a real one with its secret changed
ctl n0 invite >"$T/real" || fail "invite"
[ "$(tail -c 2 "$T/real" | head -c 1)" = 0 ] && digit=1 || digit=0
forged=$(sed "s/.\$/$digit/" "$T/real")
run forged "$TRAINCTL" --socket "$T/late/ctl" join "$forged"
expect_error forged "join refused by .*: the invite was used already, has expired or was not made"
lists_key n0 "$(key_of late)" && fail "a forged invite admitted its node" \
  || pass "the forged invite admitted nothing"
lists_key late "$(key_of n0)" && fail "the failed joins left n0's key listed on late" \
  || pass "late took back the inviter's key after each failed join"

# ---- a member without admin cannot admit or revoke for the cluster --------------------------
run noadmin "$TRAINCTL" --socket "$T/n2/ctl" invite
expect_error noadmin "admitted without admin: only an admin node can invite"
ctl n2 revoke "$(key_of n3)" >"$T/n2revoke" || fail "n2 revokes n3 on its own list"
grep -q "signed revocation" "$T/n2revoke" && fail "a member without admin spread a revocation" \
  || pass "n2 (no admin) revoked n3 for itself only"
sleep 1
lists_key n4 "$(key_of n3)" && pass "n4 still lists n3" || fail "n2's revocation reached n4"

# ---- forged admissions ------------------------------------------------------------------------
read -r FPUB FSEC < <("$FORGE" --keygen 2>/dev/null || echo "")
[ -n "${FPUB:-}" ] || { echo "SKIP: no CURVE in this libzmq"; exit 77; }
ctl n1 allow "$FPUB" >/dev/null || fail "admit the forger on n1 (no admin)"
read -r VPUB _ < <("$FORGE" --keygen)
refused0=$(admission n1 records_refused)
TD_PEER_PUBLIC=$FPUB TD_PEER_SECRET=$FSEC "$FORGE" "$(endpoint_of n1)" "$(key_of n1)" \
  badsig "$VPUB" "$(key_of n0)" >/dev/null || fail "td_forge badsig"
TD_PEER_PUBLIC=$FPUB TD_PEER_SECRET=$FSEC "$FORGE" "$(endpoint_of n1)" "$(key_of n1)" \
  nonadmin "$VPUB" >/dev/null || fail "td_forge nonadmin"
sleep 0.5
refused1=$(admission n1 records_refused)
[ "$((refused1 - refused0))" -eq 2 ] && pass "n1 refused and counted both forged admissions" \
  || fail "n1 counted $((refused1 - refused0)) refused records, not 2"
grep -q "signature does not verify (forged)" "$T/n1.log" && pass "n1 logged the bad signature" \
  || fail "no log line for the bad signature"
grep -q "signed by key .*, which is not an admin here" "$T/n1.log" \
  && pass "n1 logged the admission signed by a member without admin" \
  || fail "no log line for the non-admin's admission"
lists_key n1 "$VPUB" && fail "a forged admission listed its key" \
  || pass "the forged admissions listed nothing"

# ---- an admin's revocation ends the member everywhere; its old admission cannot come back ----
cp "$T/n1/admissions" "$T/before"
ctl n0 revoke "$(key_of n5)" | grep -q "signed revocation sent to every member" \
  && pass "n0 (admin) signed and sent the revocation" || fail "n0's revocation was not spread"
sleep 1.5
gone=0 left=0
id5=$(ctl n5 key --json | grep -o '"node_id":"[0-9a-f]*"' | head -n 1 | cut -d'"' -f4)
for n in "${NAMES[@]}"; do
  [ "$n" = n5 ] && continue
  lists_key "$n" "$(key_of n5)" || gone=$((gone + 1))
  st=$(ctl "$n" peers --json | grep -o "\"node_id\":\"$id5\"[^}]*" | grep -o '"state":"[a-z]*"')
  [ "$st" = '"state":"alive"' ] || left=$((left + 1))
done
[ "$gone" -eq 11 ] && pass "n5's key left the allowlist of all 11 other nodes" \
  || fail "n5's key left only $gone of 11 allowlists"
[ "$left" -eq 11 ] && pass "no node keeps n5 as an alive member" \
  || fail "only $left of 11 nodes ended n5's membership"
old=$(grep -vxFf "$T/n1/admissions" "$T/before" | grep -v '^#' | head -n 1)
[ -n "$old" ] || fail "no old admission of n5 to replay"
stale0=$(admission n1 records_stale)
TD_PEER_PUBLIC=$FPUB TD_PEER_SECRET=$FSEC "$FORGE" "$(endpoint_of n1)" "$(key_of n1)" \
  replay "$old" >/dev/null || fail "td_forge replay"
sleep 0.5
[ "$(admission n1 records_stale)" -gt "$stale0" ] \
  && pass "n1 refused and counted the replayed admission of revoked n5" \
  || fail "the replayed admission was not counted"
grep -q "an outdated admission of key .* (a replay" "$T/n1.log" && pass "n1 logged the replay" \
  || fail "no log line for the replay"
lists_key n1 "$(key_of n5)" && fail "the replay brought n5 back" || pass "n5 stays revoked on n1"

# ---- an admin admitted by invite admits a node of its own --------------------------------------
ctl n0 invite --admin >"$T/admin-invite" || fail "invite --admin"
ctl late join "$(cat "$T/admin-invite")" >/dev/null || fail "late joins by an admin invite"
ctl late invite >"$T/late-invite" || fail "late (admin by invite) cannot invite"
ctl later join "$(cat "$T/late-invite")" >/dev/null || fail "later joins by late's invite"
sleep 1.5
ok=0
for n in n0 n1 n2 n11; do lists_key "$n" "$(key_of later)" && ok=$((ok + 1)); done
[ "$ok" -eq 4 ] && pass "an admission signed by the invited admin is accepted by the members" \
  || fail "later is listed on $ok of 4 members"

# ---- a handshake that times out is not a wrong key -----------------------------------------------
start_bare busy
python3 -c '
import socket, sys, threading, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
print(s.getsockname()[1], flush=True)
s.settimeout(60)
def drop_later(c):
    time.sleep(4.5)
    c.close()
while True:
    try:
        c, _ = s.accept()
    except OSError:
        break
    threading.Thread(target=drop_later, args=(c,), daemon=True).start()
' >"$T/mute.port" &
mute_pid=$!
for i in $(seq 50); do [ -s "$T/mute.port" ] && break; sleep 0.1; done
MUTE="tcp://127.0.0.1:$(cat "$T/mute.port")"
ctl n0 invite >"$T/mute-invite" || fail "invite for the mute listener"
# the same join string, naming the listener's endpoint instead of n0's
IFS=, read -r tag _ rest <"$T/mute-invite"
run mute_join ctl busy join "$tag,$MUTE,$rest"
kill "$mute_pid" 2>/dev/null
expect_error mute_join "^trainctl: (error: )?join failed: the node at $MUTE did not finish a \
handshake within [0-9.]+ s \(check that traind runs there and is reachable from here, then \
retry the join: a busy node may be slow to answer\)$"
grep -q "does not hold the key" "$T/mute_join.err" && fail "a timeout reported as a wrong key" \
  || pass "the timeout is not reported as a wrong key"
finish
