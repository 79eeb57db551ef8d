#!/usr/bin/env bash
# Compiler wrapper for building mmcv 2.1.0 against torch >= 2.10, whose headers need
# C++20 while mmcv's setup.py forces -std=c++14/17. Drops those flags, adds -std=c++20.
# The real compiler is $SRVIT_REAL_CXX (default g++).
args=()
for a in "$@"; do
  case "$a" in
    -std=c++14|-std=c++17|-std=gnu++14|-std=gnu++17) ;;
    *) args+=("$a") ;;
  esac
done
exec "${SRVIT_REAL_CXX:-g++}" -std=c++20 "${args[@]}"
