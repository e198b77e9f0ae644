#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the history-store tests and print, on stdout, the one
# line that points the tests at it:
#
#   eval "$(bash .ci/postgres.sh)"     # sets DLROVER_KFP_TEST_POSTGRES_URL
#
# Why a script of our own: the tests must run PostgreSQL for real (not a mock), CI machines are
# bare Debian containers without a running server, and a cluster in a temporary directory on a
# free loopback port never collides with anything the machine already runs.
#
# Everything except the export line goes to stderr. When PostgreSQL cannot be installed or
# started, the script says why on stderr, prints nothing on stdout and exits 0, so the
# PostgreSQL tests skip with a visible reason instead of failing the build.
#
# The cluster lives until the machine goes away or until `pg_ctl -D <dir>/data stop` (the
# directory is printed on stderr). It runs with fsync off: it holds test data only.
set -u

log() { printf 'postgres.sh: %s\n' "$*" >&2; }
give_up() { log "$* -- PostgreSQL tests will be skipped"; exit 0; }

find_bindir() {
  local dir
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ]; then
      printf '%s\n' "$dir"
      return 0
    fi
  done
  local initdb
  initdb=$(command -v initdb 2>/dev/null) || return 1
  initdb=$(readlink -f "$initdb")
  dir=$(dirname "$initdb")
  [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ] || return 1
  printf '%s\n' "$dir"
}

bindir=$(find_bindir)
if [ -z "$bindir" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    give_up "no PostgreSQL server binaries and not root, cannot apt-get install postgresql"
  fi
  command -v apt-get >/dev/null 2>&1 || give_up "no PostgreSQL server binaries and no apt-get"
  log "installing PostgreSQL with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -q && apt-get install -y -q --no-install-recommends postgresql; } >&2 \
    || give_up "apt-get install postgresql failed"
  bindir=$(find_bindir) || give_up "postgresql installed but no initdb/pg_ctl found"
fi
log "using $bindir"

# initdb refuses to run as root: run the server as the 'postgres' user when we are root.
if [ "$(id -u)" -eq 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres >&2 \
    || give_up "cannot create the postgres user"
  if command -v runuser >/dev/null 2>&1; then
    as_pg() { runuser -u postgres -- "$@"; }
  else
    as_pg() { su postgres -s /bin/sh -c "$(printf '%q ' "$@")"; }
  fi
  owner=postgres
else
  as_pg() { "$@"; }
  owner=$(id -un)
fi

base=$(mktemp -d "${TMPDIR:-/tmp}/dlrover-kfp-pg.XXXXXX") || give_up "cannot create a temp dir"
chmod 755 "$base"
chown "$owner" "$base" || give_up "cannot hand $base to $owner"

# A free loopback port: start at a pseudo-random one and step until nothing answers.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=$(( 20000 + (RANDOM % 20000) ))
for _ in $(seq 1 200); do
  port_in_use "$port" || break
  port=$(( port + 1 ))
done
port_in_use "$port" && give_up "no free port found"

user=dlrover_kfp
db=dlrover_kfp_test
password=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
pwfile="$base/superuser.pw"
od -An -N12 -tx1 /dev/urandom | tr -d ' \n' > "$pwfile"
chown "$owner" "$pwfile"
chmod 600 "$pwfile"

as_pg "$bindir/initdb" -D "$base/data" -U postgres --pwfile="$pwfile" \
  --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 --no-sync >&2 \
  || as_pg "$bindir/initdb" -D "$base/data" -U postgres --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --no-sync >&2 \
  || give_up "initdb failed"

as_pg "$bindir/pg_ctl" -D "$base/data" -l "$base/server.log" -w -t 60 \
  -o "-p $port -k $base -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
  start >&2 || { cat "$base/server.log" >&2 2>/dev/null; give_up "the server did not start"; }

psql_admin() { as_pg "$bindir/psql" -h "$base" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -q "$@"; }
psql_admin -c "CREATE ROLE $user LOGIN PASSWORD '$password'" >&2 \
  && psql_admin -c "CREATE DATABASE $db OWNER $user" >&2 \
  || give_up "cannot create the test role and database"

log "PostgreSQL running on 127.0.0.1:$port, data in $base/data"
log "stop it with: ${owner:+(as $owner) }$bindir/pg_ctl -D $base/data stop"
printf 'export DLROVER_KFP_TEST_POSTGRES_URL=postgresql+psycopg://%s:%s@127.0.0.1:%s/%s\n' \
  "$user" "$password" "$port" "$db"
# How to restart it (a test of what a server restart does to runs that end meanwhile): the
# same options, read back from postmaster.opts by pg_ctl. How to stop it (the caller's EXIT
# trap runs this): as the server's owner, fast, then clean up.
if [ "$(id -u)" -eq 0 ]; then
  printf "export DLROVER_KFP_TEST_POSTGRES_RESTART='su -s /bin/sh %s -c \"%s -D %s restart -m fast -w -s -l %s\"'\n" \
    "$owner" "$bindir/pg_ctl" "$base/data" "$base/server.log"
  printf "export DLROVER_KFP_TEST_POSTGRES_STOP='su -s /bin/sh %s -c \"%s -D %s stop -m fast -s\" && rm -rf %s'\n" \
    "$owner" "$bindir/pg_ctl" "$base/data" "$base"
else
  printf "export DLROVER_KFP_TEST_POSTGRES_RESTART='%s -D %s restart -m fast -w -s -l %s'\n" \
    "$bindir/pg_ctl" "$base/data" "$base/server.log"
  printf "export DLROVER_KFP_TEST_POSTGRES_STOP='%s -D %s stop -m fast -s && rm -rf %s'\n" \
    "$bindir/pg_ctl" "$base/data" "$base"
fi
