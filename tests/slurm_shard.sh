#!/usr/bin/env bash
# slurm_shard.sh — fleet sharding on a real batch system: start a one-node Slurm cluster
# (Debian's slurm-wlm and munge) in a scratch directory, submit `kiln warm --shard
# $SLURM_ARRAY_TASK_ID/3` as an array job of 3 tasks, merge the shards, and compare the merged
# cache with an unsharded warm of the same manifest row for row, byte for byte (key, spec,
# arch, key material, cubin). Everything it starts is stopped and removed on exit.
#
#   tests/slurm_shard.sh KILN_BINARY [SCRATCH_DIR]
#
# Exit 0: identical; 1: a failure (the reason on stderr); 77: cannot run here (no Slurm or
# munge binaries, not root, no python3), with the reason on stdout. The figures (time per
# shard, total, rows) go to stdout. Called by tests/test_slurm.c; docs/fleet.md shows the run.
set -u

KILN=${1:?usage: slurm_shard.sh KILN_BINARY [SCRATCH_DIR]}
KILN=$(cd "$(dirname "$KILN")" && pwd)/$(basename "$KILN")
N=3
ARCH=sm_80

skip() { echo "skip: $*"; exit 77; }
fail() { echo "slurm_shard: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || skip "not root (slurmd must run as root to start job steps)"
for b in munged mungekey slurmctld slurmd sbatch squeue scontrol sinfo python3; do
    command -v "$b" >/dev/null 2>&1 ||
        skip "$b not found (apt-get install slurm-wlm munge; .ci/run installs them)"
done

T=${2:-}
if [ -z "$T" ]; then T=$(mktemp -d /tmp/kiln-slurm.XXXXXX) || fail "mktemp"; fi
mkdir -p "$T" && chmod 0700 "$T"
T=$(cd "$T" && pwd)

teardown() {
    [ -n "${JOB:-}" ] && SLURM_CONF=$T/slurm.conf scancel "$JOB" >/dev/null 2>&1
    for p in slurmd slurmctld munged; do
        if [ -s "$T/$p.pid" ]; then
            pid=$(cat "$T/$p.pid")
            kill "$pid" 2>/dev/null
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -9 "$pid" 2>/dev/null
        fi
    done
    [ -z "${KEEP:-}" ] && rm -rf "$T"
}
trap teardown EXIT

# ---- munge: its own key, socket and files ---------------------------------------------------
mkdir -p "$T/munge" && chmod 0700 "$T/munge"
mungekey --create --keyfile="$T/munge/munge.key" >/dev/null 2>&1 ||
    dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 0400 "$T/munge/munge.key"
SOCK=$T/munge/munge.socket
munged --force --socket="$SOCK" --key-file="$T/munge/munge.key" --pid-file="$T/munged.pid" \
    --log-file="$T/munge/munged.log" --seed-file="$T/munge/seed" >/dev/null 2>&1 ||
    fail "munged did not start: $(tail -3 "$T/munge/munged.log" 2>/dev/null)"

# ---- slurm: one node (this host), one partition, no accounting, no cgroups -------------------
HOST=$(hostname -s)
CPUS=$(nproc)
PORT=$((20000 + RANDOM % 20000))
mkdir -p "$T/state" "$T/spool" "$T/out"
cat >"$T/slurm.conf" <<EOF
ClusterName=kilntest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=kiln Nodes=$HOST Default=YES MaxTime=10 State=UP OverSubscribe=YES
EOF
export SLURM_CONF=$T/slurm.conf
slurmctld -f "$SLURM_CONF" -i >/dev/null 2>&1 || fail "slurmctld did not start: $(tail -5 "$T/slurmctld.log")"
slurmd -f "$SLURM_CONF" >/dev/null 2>&1 || fail "slurmd did not start: $(tail -5 "$T/slurmd.log")"
for _ in $(seq 100); do
    state=$(sinfo -h -n "$HOST" -o %t 2>/dev/null)
    case "$state" in idle*|mix*|alloc*) break ;; esac
    sleep 0.2
done
case "$state" in idle*|mix*|alloc*) ;; *) fail "node $HOST is '$state', not idle: $(tail -5 "$T/slurmd.log")" ;; esac

# ---- the manifest: 6 kernels for one arch -------------------------------------------------------
cat >"$T/fleet.manifest" <<EOF
op=decode dtype={f16,bf16} head_dim={64,128} group=1
op=merge dtype=f16 head_dim={64,128}
EOF

# ---- the array job -----------------------------------------------------------------------------
cat >"$T/warm.sbatch" <<EOF
#!/bin/bash
#SBATCH --array=0-$((N - 1))
#SBATCH --cpus-per-task=1
#SBATCH --output=$T/out/%a.txt
#SBATCH --error=$T/out/%a.err
"$KILN" --cache "$T/shards/\$SLURM_ARRAY_TASK_ID" warm --arch $ARCH --jobs 1 --json \\
    --shard "\$SLURM_ARRAY_TASK_ID/\$SLURM_ARRAY_TASK_COUNT" "$T/fleet.manifest"
EOF
mkdir -p "$T/shards"
t0=$(date +%s.%N)
JOB=$(sbatch --parsable --chdir="$T" "$T/warm.sbatch") || fail "sbatch failed"
JOB=${JOB%%;*}
for _ in $(seq 600); do
    [ -z "$(squeue -h -j "$JOB" 2>/dev/null)" ] && break
    sleep 0.2
done
t1=$(date +%s.%N)
[ -z "$(squeue -h -j "$JOB" 2>/dev/null)" ] || fail "array job $JOB still queued after 120 s: $(squeue -j "$JOB")"
JOB_DONE=$JOB
JOB=
for i in $(seq 0 $((N - 1))); do
    [ -s "$T/out/$i.txt" ] || fail "task $i wrote nothing: $(cat "$T/out/$i.err" 2>/dev/null; tail -5 "$T/slurmd.log")"
done

# ---- merge, and the unsharded warm --------------------------------------------------------------
"$KILN" merge "$T/merged.db" "$T"/shards/* >"$T/merge.txt" 2>&1 || fail "merge failed: $(cat "$T/merge.txt")"
t2=$(date +%s.%N)
"$KILN" --cache "$T/full" warm --arch $ARCH --jobs 1 --json "$T/fleet.manifest" >"$T/full.json" 2>"$T/full.err" ||
    fail "the unsharded warm failed: $(cat "$T/full.err")"

python3 - "$T" "$N" "$JOB_DONE" "$t0" "$t1" "$t2" <<'EOF'
import json, sqlite3, sys, hashlib
t, n, job = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t0, t1, t2 = map(float, sys.argv[4:7])
def rows(path):
    db = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
    r = db.execute("SELECT key, spec, arch, key_material, cubin, checksum FROM kernels ORDER BY key").fetchall()
    db.close()
    return r
shards = [json.load(open("%s/out/%d.txt" % (t, i))) for i in range(n)]
full = json.load(open("%s/full.json" % t))
merged, whole = rows(t + "/merged.db"), rows(t + "/full/kernels.db")
for i, s in enumerate(shards):
    print("shard %d/%d (Slurm job %s_%d): %d kernels, %d compiled, %d failed in %.2f s"
          % (i, n, job, i, s["kernels"], s["compiled"], s["failed"], s["seconds"]))
print("array job, submit to last task done: %.2f s; merge: %.2f s" % (t1 - t0, t2 - t1))
print("unsharded warm: %d kernels in %.2f s" % (full["kernels"], full["seconds"]))
digest = lambda rs: hashlib.sha256(b"".join(k.encode() + m.encode() + c for k, _, _, m, c, _ in rs)).hexdigest()
print("merged: %d rows, sha256 %s; unsharded: %d rows, sha256 %s"
      % (len(merged), digest(merged)[:16], len(whole), digest(whole)[:16]))
ok = merged == whole and len(whole) == full["kernels"] == sum(s["kernels"] for s in shards) == 6
ok = ok and all(s["failed"] == 0 and s["shard"] == [i, n] for i, s in enumerate(shards))
print("byte for byte (key, spec, arch, key material, cubin, checksum): %s" % ("identical" if ok else "DIFFERENT"))
sys.exit(0 if ok else 1)
EOF
