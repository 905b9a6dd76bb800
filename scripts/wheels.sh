#!/usr/bin/env bash
# The Python package's release artifacts: the abi3 wheel (one wheel for CPython 3.10 and up, this machine's platform)
# and the sdist, built with maturin, then the wheel checked in a fresh virtual environment: it installs (with its
# pyarrow dependency from PyPI), imports, answers one query and refuses one.
#
#   scripts/wheels.sh            the release wheel (the `wheel-release` cargo profile of the root Cargo.toml:
#                                optimised for size, fat LTO, symbols stripped) and the sdist, in $OUT; cold, it
#                                compiles DataFusion optimised
#                                (BENCHMARKS.md gives the time on a 2-core machine)
#   scripts/wheels.sh --check    the same path against a debug build (what .ci/run does: it reuses the build of
#                                the tests, `--features workspace-build`, so that DataFusion is not compiled again)
#   scripts/wheels.sh --test WHEEL   only the check, of a wheel built elsewhere (the CI workflow's test step)
#
# Environment: OUT (default: $CARGO_TARGET_DIR/wheels, or target/wheels), PYTHON (default python3: the interpreter
# of the check's virtual environment and of maturin's), CARGO_TARGET_DIR as for cargo.
# The platforms of a release (manylinux x86_64/aarch64, macOS arm64/x86_64, Windows) are built by
# .github/workflows/wheels.yml with maturin's action; it runs `--test` on each.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mode=release
wheel_to_test=
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  --test) mode=test; wheel_to_test=${2:?"--test needs the wheel's path"} ;;
  *) echo "usage: scripts/wheels.sh [--check | --test WHEEL]" >&2; exit 2 ;;
esac
python=${PYTHON:-python3}
out=${OUT:-${CARGO_TARGET_DIR:-$root/target}/wheels}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The interpreter of a virtual environment (bin/ on Unix, Scripts/ on Windows).
venv_python() {
  if [ -x "$1/bin/python" ]; then echo "$1/bin/python"; else echo "$1/Scripts/python.exe"; fi
}

# Installs the wheel $1 in a fresh virtual environment and uses it from the checkout's root: one query answered,
# one refused (nothing spent), and no test-only function in it.
check_wheel() {
  local wheel=$1
  "$python" -m venv "$work/check"
  local py
  py=$(venv_python "$work/check")
  "$py" -m pip install --disable-pip-version-check -q "$wheel"
  "$py" - <<'EOF'
import dpfusion

s = dpfusion.Session("config/pums.toml")
r = s.sql("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex ORDER BY sex")
assert r.columns == ["sex", "n"] and len(r) == 2 and r.accuracy["n"]["kind"] == "noisy", r
spent = s.budget()["rho_spent"]
try:
    s.sql("SELECT age FROM pums")
    raise SystemExit("a query over raw rows was answered")
except dpfusion.Refused as e:
    assert e.code == "raw_rows", e.code
assert s.budget()["rho_spent"] == spent, "a refusal spent something"
assert not hasattr(dpfusion, "_insecure_reseed_for_tests"), "a test-only function is in the wheel"
s.close()
print(f"dpfusion {dpfusion.__version__}: one query answered (rho {spent}), one refused (raw_rows)")
EOF
}

if [ "$mode" = test ]; then
  check_wheel "$wheel_to_test"
  exit 0
fi

# maturin, pinned as in the tests, in a build environment of its own.
"$python" -m venv "$work/build"
build_py=$(venv_python "$work/build")
"$build_py" -m pip install --disable-pip-version-check -q "$(grep -E '^maturin==' crates/python/requirements-test.txt)"
maturin=("$build_py" -m maturin)

rm -f "$out"/dpfusion-*.whl "$out"/dpfusion-*.tar.gz
if [ "$mode" = release ]; then
  "${maturin[@]}" build --manifest-path crates/python/Cargo.toml --profile wheel-release --out "$out" -i "$python"
else
  "${maturin[@]}" build --manifest-path crates/python/Cargo.toml --profile dev --features workspace-build \
    --out "$out" -i "$python"
fi
"${maturin[@]}" sdist --manifest-path crates/python/Cargo.toml --out "$out"

wheel=$(ls "$out"/dpfusion-*.whl)
sdist=$(ls "$out"/dpfusion-*.tar.gz)
case "$wheel" in
  *-cp310-abi3-*) ;;
  *) echo "not an abi3 wheel for CPython 3.10 and up: $wheel" >&2; exit 1 ;;
esac
# The sdist builds on its own: it carries the engine and the charts crates, not the server.
listing=$(tar -tzf "$sdist")
for f in pyproject.toml crates/python/Cargo.toml crates/engine/Cargo.toml crates/charts/Cargo.toml Cargo.lock; do
  grep -q "^dpfusion-[^/]*/$f$" <<<"$listing" || { echo "the sdist has no $f" >&2; exit 1; }
done
# ... and its workspace resolves (members, the `wheel` profile; cargo prunes the lock file of the members left out).
tar -xzf "$sdist" -C "$work"
cargo metadata --offline --format-version 1 --manifest-path "$work"/dpfusion-*/crates/python/Cargo.toml >/dev/null
grep -q '^\[profile.wheel\]' "$work"/dpfusion-*/Cargo.toml || { echo "the sdist has no [profile.wheel]" >&2; exit 1; }
check_wheel "$wheel"
ls -l "$wheel" "$sdist"
