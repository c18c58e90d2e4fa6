#!/usr/bin/env bash
# The browser tests (tests/browser/) drive Debian's headless Chromium through
# Debian's chromedriver. This installs both when either is missing, so a fresh clone's
# `make test` / .ci/run has them; a machine that has them already is left as it is.
# Browser builds that download themselves (Selenium Manager, Playwright's installer) are not
# used: only the distribution's packages, through apt.
#
# Paths: CHROMIUM_BINARY (default /usr/bin/chromium), CHROMEDRIVER (default /usr/bin/chromedriver),
# the same variables tests/browser/browser.py reads.
# Exits non-zero, naming the problem, when they are missing and cannot be installed: the browser
# tests are never skipped for want of a browser.
set -euo pipefail

CHROMIUM_BINARY="${CHROMIUM_BINARY:-/usr/bin/chromium}"
CHROMEDRIVER="${CHROMEDRIVER:-/usr/bin/chromedriver}"
PACKAGES=(chromium chromium-driver)

have_both() {
  [ -x "$CHROMIUM_BINARY" ] && [ -x "$CHROMEDRIVER" ]
}

report() {
  # A driver whose major version differs from the browser's refuses every session; say so
  # here rather than in the first test.
  local browser driver
  browser="$("$CHROMIUM_BINARY" --version 2>/dev/null || true)"
  driver="$("$CHROMEDRIVER" --version 2>/dev/null || true)"
  if [ -z "$browser" ] || [ -z "$driver" ]; then
    echo "ensure-chromium: $CHROMIUM_BINARY or $CHROMEDRIVER is present but does not run" \
         "(browser: '${browser}', driver: '${driver}')" >&2
    exit 1
  fi
  local bmajor dmajor
  bmajor="$(grep -oE '[0-9]+' <<<"${browser#* }" | head -n1)"
  dmajor="$(grep -oE '[0-9]+' <<<"${driver#* }" | head -n1)"
  if [ "$bmajor" != "$dmajor" ]; then
    echo "ensure-chromium: browser major version $bmajor ('$browser') differs from the" \
         "driver's $dmajor ('$driver'); install matching chromium and chromium-driver" >&2
    exit 1
  fi
  echo "ensure-chromium: $browser; $driver"
}

if have_both; then
  report
  exit 0
fi

echo "ensure-chromium: $CHROMIUM_BINARY or $CHROMEDRIVER missing; installing ${PACKAGES[*]} with apt-get"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: apt-get is not available on this machine; install Chromium and its" \
       "chromedriver (same major version) and set CHROMIUM_BINARY and CHROMEDRIVER to them" >&2
  exit 1
fi
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    echo "ensure-chromium: installing ${PACKAGES[*]} needs root (or password-less sudo);" \
         "run: sudo apt-get install -y ${PACKAGES[*]}" >&2
    exit 1
  fi
fi
# Another apt run on the machine (another checkout's setup) holds the dpkg lock: wait for it
# instead of failing at once.
APT_OPTS=(-o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get "${APT_OPTS[@]}" update -qq
"${SUDO[@]}" apt-get "${APT_OPTS[@]}" install -y -q "${PACKAGES[@]}"

if ! have_both; then
  echo "ensure-chromium: apt-get installed ${PACKAGES[*]} but $CHROMIUM_BINARY or" \
       "$CHROMEDRIVER is still missing" >&2
  exit 1
fi
report
