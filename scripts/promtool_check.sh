#!/usr/bin/env bash
# Lints one Prometheus scrape with `promtool check metrics`; any problem
# promtool reports fails the run.
#   scripts/promtool_check.sh FILE    a scrape saved to a file
#   scripts/promtool_check.sh URL     fetched now (http:// or https://, curl)
#   scripts/promtool_check.sh -       read from stdin
# promtool comes with Debian's `prometheus` package
# (apt-get install -y --no-install-recommends prometheus); PROMTOOL=PATH
# names another. Exit 0: no problem; 1: problems, or nothing to check;
# 2: usage, or no promtool or curl.
set -euo pipefail
me=promtool_check
usage() {
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
[ $# -eq 1 ] || usage
src=$1
case $src in -h | --help) usage ;; esac

promtool=${PROMTOOL:-$(command -v promtool || true)}
if [ -z "$promtool" ] || [ ! -x "$promtool" ]; then
    echo "$me: no promtool: apt-get install -y --no-install-recommends prometheus, or PROMTOOL=PATH" >&2
    exit 2
fi

scrape=$(mktemp)
trap 'rm -f "$scrape"' EXIT
case $src in
http://* | https://*)
    command -v curl >/dev/null || {
        echo "$me: curl is needed to fetch $src" >&2
        exit 2
    }
    # A scrape is a plain GET of the target itself, as Prometheus makes it.
    if ! curl -sS --fail --max-time 10 -o "$scrape" "$src"; then
        echo "$me: cannot fetch $src" >&2
        exit 1
    fi
    ;;
-) cat >"$scrape" ;;
*)
    [ -f "$src" ] || {
        echo "$me: no such file: $src" >&2
        exit 2
    }
    cp "$src" "$scrape"
    ;;
esac

# An empty answer lints clean; it is no scrape.
samples=$(grep -cv -e '^#' -e '^[[:space:]]*$' "$scrape" || true)
if [ "$samples" -eq 0 ]; then
    echo "$me: $src holds no samples" >&2
    exit 1
fi

# promtool prints one line per problem (metric, then what is wrong) and
# exits non-zero; a line printed with exit 0 counts as a problem too.
rc=0
out=$("$promtool" check metrics <"$scrape" 2>&1) || rc=$?
if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
    printf '%s\n' "$out" >&2
    echo "$me: $src: $(printf '%s\n' "$out" | grep -c .) problem line(s), promtool exit $rc" >&2
    exit 1
fi
echo "$me: $src: $samples samples, no problems ($("$promtool" --version 2>&1 | head -1))"
