#!/usr/bin/env bash
# Drives a real `dpfusion serve` with real clients: Debian's psql, pgjdbc (when java and the driver are there) and
# psycopg 3 (+ pandas, SQLAlchemy) in a Python venv.
# Not part of CI (it needs postgresql-client and PyPI). The examples of docs/serving.md come from its output.
# Usage: scripts/serve-demo.sh [path/to/dpfusion]   (default: the debug build)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-${CARGO_TARGET_DIR:-target}/debug/dpfusion}"
WORK="$(mktemp -d)"
PORT="${PORT:-55433}"
trap 'kill "${SERVER:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
command -v psql >/dev/null || { echo "needs psql (apt-get install postgresql-client)"; exit 2; }

sed "s#\.\./examples#$PWD/examples#" config/pums.toml > "$WORK/server.toml"
cat >> "$WORK/server.toml" <<TOML
[ledger]
path = "ledger.sqlite"

[server]
listen = "127.0.0.1:$PORT"
TOML

echo '$ dpfusion analyst add alice --rho 0.5 --password-stdin --reason "first analyst"'
echo "alice-password" | "$BIN" analyst add alice --rho 0.5 --password-stdin -c "$WORK/server.toml" --reason "first analyst"
echo '$ dpfusion cap pums --rho 2 --reason "owner cap"'
"$BIN" cap pums --rho 2 --reason "owner cap" -c "$WORK/server.toml"
"$BIN" serve -c "$WORK/server.toml" 2> "$WORK/serve.log" &
SERVER=$!
for _ in $(seq 100); do grep -q listening "$WORK/serve.log" && break; sleep 0.2; done
cat "$WORK/serve.log"

export PGPASSWORD=alice-password
CONN="host=127.0.0.1 port=$PORT user=alice dbname=dpfusion sslmode=disable"
for meta in '\dt' '\d pums'; do
  echo "\$ psql -c '$meta'"
  psql "$CONN" -c "$meta" 2>&1 || true
done
for q in "SELECT COUNT(*) FROM pums" "SELECT sex, AVG(income) FROM pums GROUP BY sex" "SELECT * FROM pums"; do
  echo "\$ psql -c \"$q\""
  psql "$CONN" -c "$q" 2>&1 || true
done
# One session: dp_last_release() is the last release of the same connection.
echo '$ psql -c "SELECT COUNT(*) FROM pums WHERE age >= 65" -c "SELECT * FROM dp_last_release()" -c "SHOW dp.budget"'
psql "$CONN" -c "SELECT COUNT(*) FROM pums WHERE age >= 65" -c "SELECT * FROM dp_last_release()" -c "SHOW dp.budget" 2>&1

JDBC_JAR="${JDBC_JAR:-/usr/share/java/postgresql.jar}"   # Debian: apt-get install libpostgresql-jdbc-java
if command -v java >/dev/null && [ -f "$JDBC_JAR" ]; then
  echo '$ java -cp postgresql.jar scripts/JdbcDemo.java'
  java -cp "$JDBC_JAR" scripts/JdbcDemo.java "$PORT" 2>&1 || true
fi

python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "psycopg[binary]" pandas sqlalchemy
"$WORK/venv/bin/python" - "$PORT" <<'PY'
import sys, psycopg, pandas as pd, sqlalchemy
port = sys.argv[1]
# pandas through SQLAlchemy: its connect-time catalog queries (version(), current_schema(), ...) are answered too.
engine = sqlalchemy.create_engine(f"postgresql+psycopg://alice:alice-password@127.0.0.1:{port}/dpfusion")
print(pd.read_sql("SELECT educ, COUNT(*) AS n FROM pums GROUP BY educ ORDER BY educ", engine).head())
# psycopg directly: notices, the release metadata, bound parameters, refusals.
conn = psycopg.connect(f"host=127.0.0.1 port={port} user=alice dbname=dpfusion password=alice-password")
conn.add_notice_handler(lambda d: print("NOTICE:", d.message_primary))
with conn.cursor() as cur:
    cur.execute("SELECT COUNT(*) FROM pums WHERE age > %s", (40,))   # a bound parameter (extended protocol)
    print("adults over 40:", cur.fetchone()[0])
    cur.execute("SELECT column_name, std, ci_half_width, rho, rho_remaining FROM dp_last_release()")
    print(cur.fetchall())
    try:
        cur.execute("SELECT income FROM pums")
    except psycopg.Error as e:
        print("refused:", e.sqlstate, e.diag.message_primary, "| hint:", e.diag.message_hint)
PY
