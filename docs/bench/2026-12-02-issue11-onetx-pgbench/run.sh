#!/usr/bin/env bash
# run.sh DUR ROUNDS script... : interleaved pgbench rounds (issue 11, one transaction per message).
# Setup used (2026-12-02): a private PostgreSQL 15 cluster (initdb as postgres, port 55411,
# fsync and synchronous_commit on, shared_buffers=256MB), database idemkit, schema b migrated
# with `idemkit migrate up -schema b` (versions 1-14) plus the bench's table:
#   CREATE TABLE b.accounts (id text PRIMARY KEY, balance bigint NOT NULL, updated int NOT NULL)
# Each round: a fresh consumer name, its 6 position rows inserted first (so every variant
# finds its row, as the consumer does after a partition's first write), a CHECKPOINT, then
# pgbench -M prepared -c 6 -j 2 (client = partition). PG CPU: utime+stime of the postmaster
# and its children (exited backends through cutime) over the round, per transaction.
set -euo pipefail
DB="postgres://postgres@127.0.0.1:55411/idemkit?sslmode=disable"
DUR=$1; ROUNDS=$2; shift 2
PM=$(head -1 /tmp/onetx11/data/postmaster.pid)
pgcpu() { # ticks of postmaster + children (live ones; exited backends are counted via cutime of postmaster)
  local t=0
  for p in $PM $(ps -o pid= --ppid $PM); do
    if [ -r /proc/$p/stat ]; then
      s=$(sed 's/.*) //' /proc/$p/stat); set -- $s
      t=$((t + ${12} + ${13} + ${14} + ${15}))
    fi
  done
  echo $t
}
for r in $(seq 1 $ROUNDS); do
  for sc in "$@"; do
    name=$(basename $sc .sql)
    cons="$name-$r-$RANDOM"
    extra=""
    [ -n "${PCM:-}" ] && extra="-c plan_cache_mode=$PCM"
    if [[ $name == *spread* ]]; then
      for g in 0 1 2 3 4 5; do
        psql -qAt "$DB" -c "insert into b.consumer_positions (consumer, topic, kafka_partition, next_offset, epoch) values ('$cons', 'bench', $g, 0, 0)" -c "insert into b.consumer_positions (consumer, topic, kafka_partition, next_offset, epoch) select 'filler-$cons', 'bench', $g*1000+f, 0, 0 from generate_series(1,90) f" >/dev/null
      done
      psql -qAt "$DB" -c "select kafka_partition, ctid from b.consumer_positions where consumer='$cons'" | tr '\n' ' '; echo
    else
      psql -qAt "$DB" -c "insert into b.consumer_positions (consumer, topic, kafka_partition, next_offset, epoch) select '$cons', 'bench', g, 0, 0 from generate_series(0,5) g" >/dev/null
    fi
    psql -qAt "$DB" -c "checkpoint" >/dev/null
    lsn0=$(psql -qAt "$DB" -c "select pg_current_wal_lsn()")
    hot0=$(psql -qAt "$DB" -c "select n_tup_upd||' '||n_tup_hot_upd from pg_stat_user_tables where relid='b.consumer_positions'::regclass")
    c0=$(pgcpu)
    out=$(PGOPTIONS="$extra" /usr/lib/postgresql/15/bin/pgbench -n -M prepared -c ${CLIENTS:-6} -j ${THREADS:-2} -T $DUR -D off=-1 -D cons=$cons -D topic=bench -D ts='2026-12-02 03:00:00+00' -f $sc "$DB" 2>&1)
    c1=$(pgcpu)
    lsn1=$(psql -qAt "$DB" -c "select pg_current_wal_lsn()")
    sleep 0.5
    hot1=$(psql -qAt "$DB" -c "select n_tup_upd||' '||n_tup_hot_upd from pg_stat_user_tables where relid='b.consumer_positions'::regclass")
    tx=$(echo "$out" | awk '/number of transactions actually processed/ {print $NF}' | cut -d/ -f1)
    tps=$(echo "$out" | awk '/^tps/ {print $3}')
    fail=$(echo "$out" | awk '/number of failed/ {print $5}')
    wal=$(psql -qAt "$DB" -c "select pg_wal_lsn_diff('$lsn1','$lsn0')")
    printf '%-14s r%d tps %8.1f  tx %7d  pgCPU ms/tx %.3f  WAL B/tx %.0f  pos upd/hot %s -> %s  fail %s\n' \
      $name $r $tps $tx $(echo "($c1 - $c0) * 10 / $tx" | bc -l) $(echo "$wal / $tx" | bc -l) "$hot0" "$hot1" "${fail:-0}"
  done
done
