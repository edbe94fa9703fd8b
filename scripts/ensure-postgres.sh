#!/usr/bin/env bash
# Make sure a PostgreSQL server answers at 127.0.0.1:5432 (user postgres, trust auth,
# database test), installing and starting Debian's postgresql when none does.
set -euo pipefail
answers() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
if command -v pg_isready >/dev/null && answers; then exit 0; fi
if ! command -v pg_ctlcluster >/dev/null; then
  echo "installing PostgreSQL (Debian package postgresql)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
fi
version=$(ls /etc/postgresql | sort -V | tail -1)
conf=/etc/postgresql/$version/main
if ! grep -q "cosigner-test" "$conf/pg_hba.conf"; then
  # Trust auth on loopback for the test user only; this is a test machine.
  sed -i '1i host all postgres 127.0.0.1/32 trust # cosigner-test\nhost all postgres ::1/128 trust # cosigner-test\nlocal all postgres trust # cosigner-test' "$conf/pg_hba.conf"
fi
pg_ctlcluster --skip-systemctl-redirect "$version" main start || pg_ctlcluster "$version" main start
for _ in $(seq 1 60); do answers && break; sleep 0.5; done
answers || { echo "PostgreSQL did not start" >&2; exit 1; }
psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" | grep -q 1 \
  || psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE test"
