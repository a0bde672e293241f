#!/bin/sh
# The official postgres image's entrypoint, reduced to what crashmatrix and most test
# suites use: as root, own PGDATA and drop to user postgres; on an empty PGDATA, initdb
# (POSTGRES_USER, POSTGRES_HOST_AUTH_METHOD, POSTGRES_INITDB_ARGS), listen on every
# address, create POSTGRES_DB; then exec postgres with the arguments given.
set -e
case "$1" in -*|"") set -- postgres "$@" ;; esac
if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown -R postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  user="${POSTGRES_USER:-postgres}"
  auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
  if [ -n "$POSTGRES_PASSWORD" ]; then
    printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
    pw="--pwfile=/tmp/pwfile"
  elif [ "$auth" != trust ]; then
    echo "docker-entrypoint: set POSTGRES_PASSWORD, or POSTGRES_HOST_AUTH_METHOD=trust" >&2; exit 1
  fi
  # shellcheck disable=SC2086
  initdb -D "$PGDATA" -U "$user" --auth-local=trust --auth-host="$auth" ${pw:-} $POSTGRES_INITDB_ARGS
  rm -f /tmp/pwfile
  printf "host all all all %s\n" "$auth" >> "$PGDATA/pg_hba.conf"
  printf "listen_addresses = '*'\n" >> "$PGDATA/postgresql.conf"
  db="${POSTGRES_DB:-$user}"
  if [ "$db" != postgres ]; then
    echo "CREATE DATABASE \"$db\"" | postgres --single -D "$PGDATA" postgres >/dev/null
  fi
fi
exec "$@"
