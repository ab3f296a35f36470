#!/usr/bin/env bash
# Starts a real single-node Slurm on this machine (munge, slurmctld, slurmd on localhost) for
# tests and local trials. Idempotent: a cluster already answering is left as it is.
# The node declares LOOM_SLURM_CPUS (default 8) CPUs whatever the hardware has
# (SlurmdParameters=config_overrides), so 4-8 tasks run on 2 cores.
#   eval "$(launch/slurm/start_local.sh)"    # exports SLURM_CONF for srun/sbatch
set -euo pipefail
dir=${LOOM_SLURM_DIR:-/tmp/loom-slurm}
cpus=${LOOM_SLURM_CPUS:-8}
host=$(hostname -s)
conf=$dir/slurm.conf
export SLURM_CONF=$conf

if [ -f "$conf" ] && timeout 2 sinfo -h -o %t 2>/dev/null | grep -qE "idle|mix|alloc"; then
  echo "export SLURM_CONF=$conf"
  exit 0
fi
for tool in munged slurmctld slurmd srun; do
  command -v "$tool" > /dev/null || { echo "start_local.sh: $tool not found; run ./setup.sh" >&2; exit 1; }
done
mkdir -p "$dir/state" "$dir/spool" "$dir/log"
cat > "$conf" <<CONF
ClusterName=loom
SlurmctldHost=$host
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

# Ask munge itself: a leftover (even defunct) munged process proves nothing.
if ! (munge -n 2>/dev/null | unmunge > /dev/null 2>&1); then
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  if id munge > /dev/null 2>&1; then
    chown munge:munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
    chmod 400 /etc/munge/munge.key
    su -s /bin/sh munge -c "munged" || munged --force
  else
    chmod 400 /etc/munge/munge.key
    munged --force
  fi
  for _ in $(seq 20); do
    (munge -n 2>/dev/null | unmunge > /dev/null 2>&1) && break
    sleep 0.25
  done
fi
pkill -x slurmctld 2>/dev/null || true
pkill -x slurmd 2>/dev/null || true
sleep 0.5
slurmctld -c -f "$conf"
slurmd -f "$conf"
for _ in $(seq 40); do
  if timeout 2 sinfo -h -o %t 2>/dev/null | grep -qE "idle|mix|alloc"; then
    echo "export SLURM_CONF=$conf"
    exit 0
  fi
  sleep 0.5
done
echo "start_local.sh: the node did not come up; see $dir/log/" >&2
exit 1
