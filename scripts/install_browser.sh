#!/usr/bin/env bash
# Debian's headless Chromium for the report browser test. Failure is not fatal: that test
# then skips with the reason. (Playwright's own browser download cannot work offline.)
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "install_browser: not root or no apt-get; the browser test will skip" >&2; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
  || echo "install_browser: apt-get install chromium failed; the browser test will skip" >&2
exit 0
