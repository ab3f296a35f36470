#!/usr/bin/env bash
# launch/slurm/start_local.sh as a user on a shared host meets it, against stand-in daemons (no
# Slurm or munge is started or stopped here): --dry-run says what it would change and changes
# nothing; a start leaves alone a slurmctld and slurmd it did not start (the script once ran
# `pkill -x` on both); a second start restarts only its own daemons; --stop stops only those.
#   slurm_start_script.sh
set -uo pipefail
. "$(dirname "$0")/../lib.sh"
src=$(cd "$(dirname "$0")/../.." && pwd)
test_dir
bin=$dir/bin
others=()
on_exit 'for p in "${others[@]}"; do kill "$p" 2> /dev/null; wait "$p" 2> /dev/null; done'
on_exit 'LOOM_SLURM_DIR=$dir/ours PATH=$bin:$PATH "$src/launch/slurm/start_local.sh" --stop > /dev/null 2>&1'
mkdir -p "$bin" "$dir/elsewhere"
# Stand-ins: a daemon keeps running under its own name and writes the pid file its config names;
# sinfo answers while this config's slurmd runs; munge answers.
for daemon in slurmctld slurmd; do
  key=$([ $daemon = slurmctld ] && echo SlurmctldPidFile || echo SlurmdPidFile)
  cat > "$bin/$daemon" <<DAEMON
#!/bin/bash
conf=\$(echo "\$@" | sed -n 's/.*-f \([^ ]*\).*/\1/p')
pidfile=\$(sed -n 's/^$key=//p' "\$conf")
( echo \$BASHPID > "\$pidfile"; while :; do sleep 0.2; done ) < /dev/null > /dev/null 2>&1 &
DAEMON
done
cat > "$bin/sinfo" <<'SINFO'
#!/bin/bash
pid=$(sed -n 's/^SlurmdPidFile=//p' "$SLURM_CONF" 2> /dev/null | xargs cat 2> /dev/null) &&
  [ -n "$(tr -d '\0' < "/proc/$pid/cmdline" 2> /dev/null)" ] && echo idle
SINFO
printf '#!/bin/sh\necho credential\n' > "$bin/munge"
printf '#!/bin/sh\ncat > /dev/null\n' > "$bin/unmunge"
printf '#!/bin/sh\nexit 0\n' > "$bin/munged"
printf '#!/bin/sh\nexit 0\n' > "$bin/srun"
chmod +x "$bin"/*
# Another user's daemons of the same names, with a config elsewhere (children of this script,
# which reaps them).
for daemon in slurmctld slurmd; do
  printf '#!/bin/bash\nwhile :; do sleep 0.2; done\n' > "$dir/elsewhere/$daemon"
  chmod +x "$dir/elsewhere/$daemon"
  "$dir/elsewhere/$daemon" -f "$dir/elsewhere/slurm.conf" < /dev/null > /dev/null 2>&1 &
  others+=($!)
done
sleep 0.3
# Running: a stand-in ended by a script may stay a zombie where nothing reaps it.
running() { [ -n "$(tr -d '\0' < "/proc/$1/cmdline" 2> /dev/null)" ]; }
alive() { for p in "${others[@]}"; do running "$p" || return 1; done; }
alive || die "the stand-ins did not start"
run() { LOOM_SLURM_DIR=$dir/ours PATH=$bin:$PATH "$src/launch/slurm/start_local.sh" "$@" > "$dir/out" 2> "$dir/err"; }

run --dry-run || { cat "$dir/err"; die "--dry-run"; }
[ ! -e "$dir/ours" ] || die "--dry-run made $dir/ours"
grep -q "slurmctld: pid ${others[0]} was not started by this script and is left alone" "$dir/err" &&
  grep -q "starts slurmctld and slurmd as .* on ports 6817 and 6818" "$dir/err" &&
  grep -q "munge: the munged that answers here is used as it is" "$dir/err" || { cat "$dir/err"; die "--dry-run said"; }
run || { cat "$dir/err"; die "start"; }
grep -q "^export SLURM_CONF=$dir/ours/slurm.conf$" "$dir/out" || { cat "$dir/out"; die "no export line"; }
alive || { cat "$dir/err"; die "the start ended daemons it did not start"; }
ctld=$(cat "$dir/ours/slurmctld.pid")
kill "$(cat "$dir/ours/slurmd.pid")"  # its own slurmd gone: the next start restarts what it started
sleep 0.3
run || { cat "$dir/err"; die "the second start"; }
grep -q "slurmctld: stops the one it started earlier (pid $ctld)" "$dir/err" || { cat "$dir/err"; die "restart said"; }
! running "$ctld" && alive || { cat "$dir/err"; die "the second start stopped the wrong daemons"; }
ours=("$(cat "$dir/ours/slurmctld.pid")" "$(cat "$dir/ours/slurmd.pid")")
run --stop || { cat "$dir/err"; die "--stop"; }
for p in "${ours[@]}"; do running "$p" && die "--stop left pid $p"; done
alive || die "--stop ended daemons it did not start"
echo "ok"
