#!/usr/bin/env bash
# Builds the lab extension from labextension/ (npm ci from its lock file, then npm run build) and
# either writes it into the checkout (no argument) or, with --check, first lints its sources
# (npm run lint: eslint) and runs its unit tests (npm test: node --test test/), then compares the
# build with what the wheel ships (any difference fails, naming the files). kernel_sandbox/labextensions/kernel-sandbox-frame
# is this script's output, committed with the change to labextension/ that made it.
#
# The build runs in a copy of the sources at one fixed path, BUILD_ROOT: webpack names the
# extension's container entry by the absolute path of its sources, so a build elsewhere differs in
# remoteEntry.*.js alone. Needs node and npm (Debian's packages do) and a Python with jupyterlab
# first on PATH (the build compiles against JupyterLab's own packages).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_ROOT=/tmp/kernel-sandbox-frame-build
shipped=kernel_sandbox/labextensions/kernel-sandbox-frame
exec 9>"${BUILD_ROOT}.lock"
flock 9  # one build at a time on this machine: they share BUILD_ROOT
trap 'rm -rf "${BUILD_ROOT}"' EXIT  # its 30,000 files (node_modules) are no use once it is done
rm -rf "${BUILD_ROOT}"
mkdir -p "${BUILD_ROOT}/labextension" "${BUILD_ROOT}/kernel_sandbox/labextensions"
tar --exclude=./node_modules --exclude=./build-frame --exclude='./src/*-source.js' --exclude='./src/*-licenses.txt' \
    -C labextension -cf - . | tar -C "${BUILD_ROOT}/labextension" -xf -
cd "${BUILD_ROOT}/labextension"
npm ci --no-audit --no-fund --loglevel=error
if [ "${1:-}" = "--check" ]; then
    npm run --silent lint  # eslint
    npm test --silent >"${BUILD_ROOT}/test.log" 2>&1 || { cat "${BUILD_ROOT}/test.log"; exit 1; }
fi
npm run --silent build >"${BUILD_ROOT}/build.log" 2>&1 || { cat "${BUILD_ROOT}/build.log"; exit 1; }
cd - >/dev/null
if [ "${1:-}" != "--check" ]; then
    rm -rf "${shipped}"
    cp -r "${BUILD_ROOT}/${shipped}" "${shipped}"
    echo "built into ${shipped}"
elif ! diff -r "${BUILD_ROOT}/${shipped}" "${shipped}" >"${BUILD_ROOT}/diff" 2>&1; then
    echo "the lab extension built from labextension/ differs from ${shipped}:"
    grep -E '^(Only in|diff |Binary)' "${BUILD_ROOT}/diff" | head -40
    echo "fix: labextension/scripts/build.sh (builds it into ${shipped}), then commit both"
    exit 1
else
    echo "the lab extension built from labextension/ is the one shipped (${shipped})"
fi
