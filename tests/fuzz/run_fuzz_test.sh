#!/usr/bin/env bash
# ctest wrapper: skip (77) with a reason when clang++ is missing.
clangxx=$1; shift
if [ -z "$clangxx" ] || [[ "$clangxx" == *NOTFOUND ]]; then
  echo "SKIPPED: clang++ not found; install clang and libclang-rt-14-dev (scripts/setup-test-deps.sh)"
  exit 77
fi
exec env CXX="$clangxx" "$@"
