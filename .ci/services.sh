# Services the tests marked `postgres` (and `slurm`) need, started by .ci/run around `make test`.
# Source this file, then call the functions; each service has its own start-X / stop-X pair and its
# own variables, so that services can be added without touching each other.
#
#   source .ci/services.sh && start-postgres && ... && stop-postgres
#
# Every server runs from a private temporary directory (data, socket, log) and is stopped by the
# PID it recorded, never by name.

# ---- PostgreSQL ---------------------------------------------------------------------------------
# A throw-away cluster: initdb + pg_ctl as the postgres user (as the current user when not root),
# listening on a Unix socket only, in a directory made by mktemp. Exports CALIBKIT_TEST_POSTGRES
# (a libpq URL of the database calibkit_test) for the tests; PG_PID holds the server's PID.
_pg_as() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

_pg_bin() {
    if [ -n "${PG_BIN:-}" ]; then echo "$PG_BIN"; return; fi
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

install-postgres() {
    if [ -n "$(_pg_bin)" ]; then return 0; fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    else
        echo "services: PostgreSQL not found (install the Debian package postgresql); postgres tests will skip" >&2
        return 1
    fi
}

start-postgres() {
    install-postgres || return 0
    local bin
    bin="$(_pg_bin)"
    PG_DIR="$(mktemp -d /tmp/calibkit-pg.XXXXXX)"
    chmod 755 "$PG_DIR"
    if [ "$(id -u)" = 0 ]; then chown postgres "$PG_DIR"; fi
    _pg_as "$bin/initdb" -D "$PG_DIR/data" -A trust -U postgres >"$PG_DIR/initdb.log" 2>&1 || {
        echo "services: initdb failed:" >&2; cat "$PG_DIR/initdb.log" >&2; return 1; }
    _pg_as "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 \
        -o "-k $PG_DIR -c listen_addresses='' -p 5432 -c fsync=off" start >/dev/null || {
        echo "services: the PostgreSQL server did not start:" >&2; cat "$PG_DIR/server.log" >&2; return 1; }
    PG_PID="$(head -n 1 "$PG_DIR/data/postmaster.pid")"
    _pg_as "$bin/createdb" -h "$PG_DIR" -p 5432 -U postgres calibkit_test
    export CALIBKIT_TEST_POSTGRES="postgresql:///calibkit_test?host=$PG_DIR&port=5432&user=postgres"
    echo "services: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') running (pid $PG_PID, socket in $PG_DIR)"
}

stop-postgres() {
    if [ -z "${PG_PID:-}" ]; then return 0; fi
    # a test may have restarted the server (tests/helpers/pgserver.py): its current PID, if recorded
    if [ -s "$PG_DIR/data/postmaster.pid" ]; then PG_PID="$(head -n 1 "$PG_DIR/data/postmaster.pid")"; fi
    kill -TERM "$PG_PID" 2>/dev/null || true    # smart shutdown
    local i
    for i in $(seq 1 60); do
        kill -0 "$PG_PID" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$PG_PID" 2>/dev/null; then kill -KILL "$PG_PID" 2>/dev/null || true; fi
    rm -rf "$PG_DIR"
    echo "services: PostgreSQL (pid $PG_PID) stopped"
    unset PG_PID PG_DIR CALIBKIT_TEST_POSTGRES
}
# ---- end PostgreSQL -----------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# SLURM: munge + slurmctld + slurmd on this host, as root.
#
# - munge: its own key, socket, pid, log and seed files in $dir/munge (the system's munge, if
#   any, is left alone); slurm.conf's AuthInfo points the SLURM daemons and clients at the socket.
# - two fake GPUs: character devices made with `mknod ... c 1 3` (the null device's numbers)
#   listed in gres.conf, so that `--gres=gpu:N` is scheduled and CUDA_VISIBLE_DEVICES is set,
#   while the processes themselves run on the CPU.
# - SlurmUser=root, ProctrackType=proctrack/linuxproc, TaskPlugin=task/none: no cgroups needed;
#   NodeAddr/SlurmctldHost at 127.0.0.1: the host name need not resolve.
#   SlurmdParameters=config_overrides lets the node declare $CALIBKIT_SLURM_CPUS CPUs (default:
#   this machine's) without being drained.
# ---------------------------------------------------------------------------------------------

slurm-dir() { echo "${CALIBKIT_SERVICES_DIR:-/tmp/calibkit-services}/slurm"; }

start-slurm() {
    local dir host cpus mem
    dir="$(slurm-dir)"
    host="$(hostname -s)"
    cpus="${CALIBKIT_SLURM_CPUS:-$(nproc)}"
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
    if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null \
            || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; }
    fi
    stop-slurm  # a cluster left running from this folder by an earlier call
    rm -rf "$dir"
    mkdir -p "$dir"/{munge,state,spool,log,dev}
    chmod 700 "$dir/munge"
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$dir/munge/munge.key"
    munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
        --seed-file="$dir/munge/munged.seed" || return 1
    for i in 0 1; do mknod "$dir/dev/gpu$i" c 1 3; done
    cat > "$dir/gres.conf" <<EOF
NodeName=$host Name=gpu File=$dir/dev/gpu[0-1]
EOF
    cat > "$dir/slurm.conf" <<EOF
ClusterName=calibkit-ci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
SlurmctldPort=${CALIBKIT_SLURMCTLD_PORT:-6817}
SlurmdPort=${CALIBKIT_SLURMD_PORT:-6818}
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
GresTypes=gpu
KillWait=5
MinJobAge=600
SchedulerParameters=sched_interval=2,bf_interval=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -f "$SLURM_CONF" -L "$dir/log/slurmctld.log" || { stop-slurm; return 1; }
    slurmd -f "$SLURM_CONF" -L "$dir/log/slurmd.log" || { stop-slurm; return 1; }
    local t
    for t in $(seq 60); do
        if sinfo -h -N -o '%T' 2>/dev/null | grep -qx idle; then
            export CALIBKIT_TEST_SLURM=1
            echo "slurm: one-node cluster up ($cpus CPUs, 2 fake GPUs; SLURM_CONF=$SLURM_CONF)"
            return 0
        fi
        sleep 0.5
    done
    echo "slurm: the node did not become idle; logs in $dir/log" >&2
    stop-slurm
    return 1
}

stop-slurm() {
    local dir pidfile pid
    dir="$(slurm-dir)"
    for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
        [ -f "$pidfile" ] || continue
        pid="$(cat "$pidfile")"
        if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
        rm -f "$pidfile"
    done
    unset CALIBKIT_TEST_SLURM
}

# ---- Chromium (no server) ---------------------------------------------------------------------------
# Debian's headless-capable browser, for the test that renders the bench report's index.html
# (tests/report/test_report_browser.py; it skips where no chromium is found).
install-chromium() {
    if command -v chromium >/dev/null 2>&1; then return 0; fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
            || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
    else
        echo "services: chromium not found (install the Debian package chromium); the browser test will skip" >&2
        return 0
    fi
}
# ---- end Chromium -----------------------------------------------------------------------------------
