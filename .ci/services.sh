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
