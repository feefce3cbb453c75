#!/usr/bin/env bash
# A Slurm cluster of three nodes on this one host, for trying the batch
# scripts beside this file: munged, slurmctld and three slurmd (node1..3),
# all under DIR, talking over loopback.
#
#   deploy/slurm/local-cluster.sh start DIR   # prints `export SLURM_CONF=...`
#   deploy/slurm/local-cluster.sh stop DIR
#
# Needs Debian's slurm-wlm and munge (`apt-get install slurm-wlm munge`)
# and root (the daemons run as root, munged with --force). Nothing outside
# DIR is written; the daemons' logs are DIR/log/. Each node offers this
# host's CPUs; tasks are bound to their CPUs (task/affinity), as on a real
# cluster, so `--cpus-per-task=1` gives a task one core.
set -euo pipefail
me=local-cluster
usage() { echo "$me: usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
DIR=$(mkdir -p "$2" && cd "$2" && pwd)
CONF=$DIR/slurm.conf
NODES=(node1 node2 node3)

stop() {
    for pid in "$DIR"/run/*.pid; do
        [ -f "$pid" ] || continue
        kill "$(cat "$pid")" 2>/dev/null || true
    done
    # Wait for them to go (slurmd ends its steps first).
    for _ in $(seq 50); do
        alive=0
        for pid in "$DIR"/run/*.pid; do
            [ -f "$pid" ] && kill -0 "$(cat "$pid")" 2>/dev/null && alive=1
        done
        [ $alive -eq 0 ] && break
        sleep 0.2
    done
    rm -f "$DIR"/run/*.pid
}

case $cmd in
stop) stop; exit 0 ;;
start) ;;
*) usage ;;
esac

for tool in munged mungekey slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null || { echo "$me: $tool not found (apt-get install slurm-wlm munge)" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "$me: the daemons run as root here; run as root" >&2; exit 1; }
stop
mkdir -p "$DIR"/{run,log,spool/ctld,state} "${NODES[@]/#/$DIR/spool/}"
chmod 700 "$DIR/run"

# munge: a key of its own and a socket in DIR.
[ -f "$DIR/munge.key" ] || mungekey --create --keyfile="$DIR/munge.key" >/dev/null
chmod 600 "$DIR/munge.key"
munged --force --key-file="$DIR/munge.key" --socket="$DIR/run/munge.socket" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/state/munged.seed"

# Free ports: the controller's, then one per node.
read -r -a PORTS < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
)
CPUS=$(nproc)
{
    echo "ClusterName=coexec-local"
    echo "SlurmctldHost=localhost(127.0.0.1)"
    echo "SlurmctldPort=${PORTS[0]}"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$DIR/run/munge.socket"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "StateSaveLocation=$DIR/spool/ctld"
    echo "SlurmdSpoolDir=$DIR/spool/%n"
    echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
    echo "SlurmdPidFile=$DIR/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
    echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/affinity"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "SchedulerType=sched/builtin"
    echo "ReturnToService=2"
    echo "SlurmdParameters=config_overrides"
    echo "MpiDefault=none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "PlugStackConfig=/dev/null"
    echo "KillWait=5"
    echo "InactiveLimit=0"
    echo "MinJobAge=600"
    echo "PrologFlags=Alloc"
    for i in "${!NODES[@]}"; do
        echo "NodeName=${NODES[$i]} NodeHostname=localhost NodeAddr=127.0.0.1 Port=${PORTS[$((i + 1))]} CPUs=$CPUS State=UNKNOWN"
    done
    echo "PartitionName=local Nodes=ALL Default=YES MaxTime=60 State=UP OverSubscribe=NO"
} >"$CONF"

export SLURM_CONF=$CONF
slurmctld -f "$CONF"
for n in "${NODES[@]}"; do
    slurmd -f "$CONF" -N "$n"
done

# Up when sinfo lists three idle nodes.
for _ in $(seq 100); do
    idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
    [ "$idle" -eq 3 ] && break
    sleep 0.2
done
if [ "$idle" -ne 3 ]; then
    echo "$me: the nodes did not come up ($idle of 3 idle); logs in $DIR/log" >&2
    sinfo -N >&2 || true
    exit 1
fi
echo "export SLURM_CONF=$CONF"
