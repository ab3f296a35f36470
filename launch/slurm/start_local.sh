#!/usr/bin/env bash
# Starts a real single-node Slurm on this machine (munge, slurmctld, slurmd on localhost) for
# tests and local trials, and stops it again. Idempotent: a cluster already answering is left as
# it is. It stops only daemons it started itself (their pids in LOOM_SLURM_DIR, each checked to
# be the program it was and to run this config), never another slurmctld, slurmd or munged.
# Before it changes anything it says on stderr what it will change on the machine:
#   - slurmctld and slurmd, run as root, with their config, state, logs and pids in
#     LOOM_SLURM_DIR (default /tmp/loom-slurm), on ports LOOM_SLURM_PORT and the next (6817);
#   - where munge does not answer: munged started (its pid in LOOM_SLURM_DIR), and where
#     /etc/munge/munge.key is missing, a random key made there (1 KiB), with /run/munge,
#     /var/lib/munge and /var/log/munge.
# The node declares LOOM_SLURM_CPUS (default 8) CPUs whatever the hardware has
# (SlurmdParameters=config_overrides), so 4-8 tasks run on 2 cores.
#   eval "$(launch/slurm/start_local.sh)"    # exports SLURM_CONF for srun/sbatch
#   launch/slurm/start_local.sh --dry-run    # says what it would change, and changes nothing
#   launch/slurm/start_local.sh --stop       # stops the daemons it started (munged too, if it did)
set -euo pipefail
mode=start
case "${1:-}" in
  "") ;;
  --stop) mode=stop ;;
  --dry-run) mode=dry ;;
  *) echo "start_local.sh: unknown option '$1'; usage: start_local.sh [--dry-run | --stop]" >&2; exit 2 ;;
esac
dir=${LOOM_SLURM_DIR:-/tmp/loom-slurm}
cpus=${LOOM_SLURM_CPUS:-8}
port=${LOOM_SLURM_PORT:-6817}
host=$(hostname -s)
conf=$dir/slurm.conf
export SLURM_CONF=$conf
say() { echo "start_local.sh: $*" >&2; }

# ours NAME PIDFILE: the pid in PIDFILE, where that process is NAME and runs with this script's
# files (its command line names $dir): a pid file outlives its process, and pids are reused.
ours() {
  local pid
  pid=$(cat "$2" 2> /dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && [ "$(cat "/proc/$pid/comm" 2> /dev/null)" = "$1" ] &&
    tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null | grep -qF "$dir/" && echo "$pid"
}
# stop_ours NAME PIDFILE: ends that daemon, if it is ours, and waits for it to go.
stop_ours() {
  local pid
  pid=$(ours "$1" "$2") || return 0
  say "stopping the $1 it started (pid $pid)"
  kill "$pid" 2> /dev/null || true
  for _ in $(seq 50); do running "$pid" || return 0; sleep 0.1; done
  kill -9 "$pid" 2> /dev/null || true
}
# A process that runs: not gone, and not a zombie its adopter has not reaped (no command line).
running() { [ -n "$(tr -d '\0' < "/proc/$1/cmdline" 2> /dev/null)" ]; }
# Others of NAME running on this machine: named, never touched.
others() {
  local mine=${2:-} pid
  for pid in $(pgrep -x "$1" || true); do
    [ "$pid" = "$mine" ] || echo "$pid"
  done
}

if [ "$mode" = stop ]; then
  stop_ours slurmd "$dir/slurmd.pid"
  stop_ours slurmctld "$dir/slurmctld.pid"
  stop_ours munged "$dir/munge/munged.pid"
  exit 0
fi
if [ -f "$conf" ] && timeout 2 sinfo -h -o %t 2>/dev/null | grep -qE "idle|mix|alloc"; then
  [ "$mode" = dry ] && say "the cluster of $conf answers: nothing to change"
  echo "export SLURM_CONF=$conf"
  exit 0
fi
for tool in munge unmunge munged slurmctld slurmd sinfo srun; do
  command -v "$tool" > /dev/null || { echo "start_local.sh: $tool not found; run ./setup.sh" >&2; exit 1; }
done

# What will change, said first. Ask munge itself: a leftover (even defunct) munged proves nothing.
munge_ok=0
(munge -n 2>/dev/null | unmunge > /dev/null 2>&1) && munge_ok=1
if [ "$munge_ok" = 1 ]; then
  say "munge: the munged that answers here is used as it is"
else
  [ -s /etc/munge/munge.key ] || say "munge: no key: creates /etc/munge/munge.key (1 KiB, random) for this machine"
  say "munge: starts munged (pid in $dir/munge/; --stop stops it), with /run/munge, /var/lib/munge, /var/log/munge"
fi
for daemon in slurmctld slurmd; do
  mine=$(ours "$daemon" "$dir/$daemon.pid" || true)
  [ -n "$mine" ] && say "$daemon: stops the one it started earlier (pid $mine), which does not answer"
  for pid in $(others "$daemon" "$mine"); do
    say "$daemon: pid $pid was not started by this script and is left alone ($(tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null))"
  done
done
say "starts slurmctld and slurmd as $(id -un) on ports $port and $((port + 1)), node $host with $cpus CPUs; config, state, logs and pids in $dir (--stop stops them)"
[ "$mode" = dry ] && exit 0

mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/munge"
cat > "$conf" <<CONF
ClusterName=loom
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF

if [ "$munge_ok" = 0 ]; then
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  pidfile=$dir/munge/munged.pid
  if id munge > /dev/null 2>&1; then
    chown munge:munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge "$dir/munge"
    chmod 400 /etc/munge/munge.key
    su -s /bin/sh munge -c "munged --pid-file=$pidfile" || munged --force --pid-file="$pidfile"
  else
    chmod 400 /etc/munge/munge.key
    munged --force --pid-file="$pidfile"
  fi
  for _ in $(seq 20); do
    (munge -n 2>/dev/null | unmunge > /dev/null 2>&1) && break
    sleep 0.25
  done
fi
stop_ours slurmd "$dir/slurmd.pid"
stop_ours slurmctld "$dir/slurmctld.pid"
slurmctld -c -f "$conf"
slurmd -f "$conf"
for _ in $(seq 40); do
  if timeout 2 sinfo -h -o %t 2>/dev/null | grep -qE "idle|mix|alloc"; then
    echo "export SLURM_CONF=$conf"
    exit 0
  fi
  sleep 0.5
done
say "the node did not come up; see $dir/log/ (another Slurm on ports $port-$((port + 1))? LOOM_SLURM_PORT picks others)"
exit 1
