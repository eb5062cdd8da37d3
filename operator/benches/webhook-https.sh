#!/usr/bin/env bash
# End-to-end HTTPS benchmark of the webhook server.
#
# Starts two servers built from examples/webhook_bench.rs on the same hyper/rustls stack and
# accept loop as `gatehouse run`:
#   baseline   parses the AdmissionReview and answers a fixed allow;
#   gatehouse  the real webhook handler over fixtures/policies.yaml;
#   group      the real webhook handler over fixtures/chain-8.yaml: eight mutating Policies in
#              one shared entry, all eight run per request.
# Then posts fixtures/pod-create.json with wrk (keep-alive, 64 connections), interleaving
# baseline and gatehouse runs to reduce drift, and prints req/s, p50/p99 latency, the
# throughput ratios against the baseline (goals: one Policy >= 0.7, the group of eight >= 0.6)
# and each server's RSS.
#
# Environment: DURATION (default 15s) per measured run, WARMUP (default 3s), CONNECTIONS
# (default 64), THREADS (default 2), VALIDATE=0 to skip the /validate run, GROUP=0 to skip the
# group run, BIN=<webhook_bench> to use a server built earlier, LOG=1 to have the
# gatehouse server log every decision as `gatehouse run` does.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fixtures="$here/fixtures"
review="$fixtures/pod-create.json"
policies="$fixtures/policies.yaml"
chain="$fixtures/chain-8.yaml"
mutate_path=/mutate/policy/bench-mutate
validate_path=/validate/policy/bench-validate
duration="${DURATION:-15s}"
warmup="${WARMUP:-3s}"
connections="${CONNECTIONS:-64}"
threads="${THREADS:-2}"

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

tmp="$(mktemp -d)"
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- tools -------------------------------------------------------------------------------------
if ! command -v wrk >/dev/null; then
    say "installing wrk"
    apt-get install -y wrk >/dev/null || { apt-get update >/dev/null && apt-get install -y wrk >/dev/null; }
fi
command -v curl >/dev/null || die "curl is required"

if [[ -n "${BIN:-}" ]]; then
    # A server built earlier (another commit's, say), for a before/after comparison.
    bin="$BIN"
    [[ -x "$bin" ]] || die "BIN=$bin is not an executable"
else
    say "building the benchmark server (release)"
    bin="$(cd "$here/.." && cargo build --release -p gatehouse --example webhook_bench \
        --message-format=json-render-diagnostics \
        | sed -n 's/.*"executable":"\([^"]*webhook_bench\)".*/\1/p' | tail -n 1)"
    [[ -x "$bin" ]] || die "cargo did not report the webhook_bench executable"
fi

# --- servers -----------------------------------------------------------------------------------
free_port() {
    local port
    for _ in $(seq 1 100); do
        port=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
    die "no free loopback port found"
}

# start NAME ARGS...: starts the server, waits for `ready`, sets $started_pid and $started_port.
start() {
    local name="$1"; shift
    started_port="$(free_port)"
    "$bin" --port "$started_port" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    started_pid=$!
    pids+=("$started_pid")
    for _ in $(seq 1 100); do
        grep -qx ready "$tmp/$name.out" 2>/dev/null && return
        kill -0 "$started_pid" 2>/dev/null || die "$name server exited: $(cat "$tmp/$name.err")"
        sleep 0.1
    done
    die "$name server not ready after 10s"
}

log_flag=()
if [[ "${LOG:-0}" == 1 ]]; then log_flag=(--log); fi
start baseline --mode baseline
base_pid=$started_pid base_port=$started_port
start gatehouse --mode gatehouse --policy "$policies" "${log_flag[@]}"
gate_pid=$started_pid gate_port=$started_port
say "baseline pid $base_pid on :$base_port, gatehouse pid $gate_pid on :$gate_port"
if [[ "${GROUP:-1}" == 1 ]]; then
    start group --mode gatehouse --policy "$chain" "${log_flag[@]}"
    group_pid=$started_pid group_port=$started_port
    group_path="$(sed -n 's/^entry \(\/mutate\/.*\)$/\1/p' "$tmp/group.out" | head -n 1)"
    [[ -n "$group_path" ]] || die "the group server named no mutating entry: $(cat "$tmp/group.out")"
    say "group pid $group_pid on :$group_port, entry $group_path"
fi

rss() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
base_idle_rss="$(rss "$base_pid" VmRSS)" gate_idle_rss="$(rss "$gate_pid" VmRSS)"

# --- correctness first -------------------------------------------------------------------------
post() {
    curl -sSk --fail-with-body -H 'Content-Type: application/json' --data-binary "@$review" \
        "https://127.0.0.1:$1$2"
}
uid="$(sed -n 's/.*"uid": *"\([^"]*\)".*/\1/p' "$review" | head -n 1)"

resp="$(post "$base_port" /)" || die "baseline request failed: $resp"
[[ "$resp" == *'"allowed":true'* && "$resp" == *"\"uid\":\"$uid\""* ]] \
    || die "baseline did not allow with uid $uid: $resp"

resp="$(post "$gate_port" "$mutate_path")" || die "gatehouse $mutate_path failed: $resp"
[[ "$resp" == *'"allowed":true'* && "$resp" == *'"patchType":"JSONPatch"'* \
    && "$resp" == *"\"uid\":\"$uid\""* ]] \
    || die "gatehouse $mutate_path did not return an allowed JSONPatch: $resp"
patch="$(sed -n 's/.*"patch":"\([^"]*\)".*/\1/p' <<<"$resp" | base64 -d)"
say "gatehouse $mutate_path: allowed, JSONPatch with $(grep -o '"op"' <<<"$patch" | wc -l) operations"

if [[ "${VALIDATE:-1}" == 1 ]]; then
    resp="$(post "$gate_port" "$validate_path")" || die "gatehouse $validate_path failed: $resp"
    [[ "$resp" == *'"allowed":true'* ]] || die "gatehouse $validate_path did not allow: $resp"
    say "gatehouse $validate_path: allowed"
fi

if [[ "${GROUP:-1}" == 1 ]]; then
    resp="$(post "$group_port" "$group_path")" || die "group $group_path failed: $resp"
    [[ "$resp" == *'"allowed":true'* && "$resp" == *'"patchType":"JSONPatch"'* ]] \
        || die "group $group_path did not return an allowed JSONPatch: $resp"
    patch="$(sed -n 's/.*"patch":"\([^"]*\)".*/\1/p' <<<"$resp" | base64 -d)"
    for want in cost-center mesh.internal proxy BPF runAsNonRoot TZ; do
        [[ "$patch" == *"$want"* ]] || die "group patch lacks $want (not all eight Policies ran): $patch"
    done
    say "group $group_path: allowed, one JSONPatch with $(grep -o '"op"' <<<"$patch" | wc -l) operations from eight Policies"
fi

# --- load --------------------------------------------------------------------------------------
cat >"$tmp/post.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open([[$review]], "rb"))
wrk.body = f:read("*a")
f:close()
EOF

# CPU time (user + system) the process PID has used, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz="$(getconf CLK_TCK)"

# load LABEL PID PORT PATH DURATION: runs wrk against the server PID, keeps wrk's output in
# $tmp/LABEL.wrk and the server's CPU time over the run in $tmp/LABEL.cpu.
load() {
    local out="$tmp/$1.wrk" before
    before="$(cpu_ticks "$2")"
    wrk -c"$connections" -t"$threads" -d"$5" --latency -s "$tmp/post.lua" \
        "https://127.0.0.1:$3$4" >"$out"
    echo $(($(cpu_ticks "$2") - before)) >"$tmp/$1.cpu"
    if grep -qE 'Non-2xx|Socket errors' "$out"; then
        cat "$out" >&2
        die "$1: wrk saw errors"
    fi
}

# Latency of wrk's distribution line PCT (50%, 99%) in milliseconds.
latency_ms() {
    awk -v p="$2" '$1 == p {
        v = $2
        if (v ~ /us$/) { sub(/us$/, "", v); v /= 1000 }
        else if (v ~ /ms$/) { sub(/ms$/, "", v) }
        else if (v ~ /s$/) { sub(/s$/, "", v); v *= 1000 }
        printf "%.3f", v
    }' "$tmp/$1.wrk"
}
rps() { awk '$1 == "Requests/sec:" { print $2 }' "$tmp/$1.wrk"; }
# Server CPU microseconds per request over the run LABEL.
cpu_us() {
    awk -v t="$(cat "$tmp/$1.cpu")" -v hz="$hz" '$2 == "requests" && $3 == "in" {
        printf "%.1f", t * 1e6 / hz / $1
    }' "$tmp/$1.wrk"
}

# target RUN: sets pid, port and path of the server a run loads.
target() {
    case "$1" in
        *baseline-*) pid=$base_pid port=$base_port path=/ ;;
        *mutate) pid=$gate_pid port=$gate_port path=$mutate_path ;;
        *validate) pid=$gate_pid port=$gate_port path=$validate_path ;;
        *group) pid=$group_pid port=$group_port path=$group_path ;;
    esac
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
say "warming up ($warmup each)"
for run in warm-baseline-0 warm-mutate; do
    target "$run"
    load "$run" "$pid" "$port" "$path" "$warmup"
done

runs=(baseline-1 mutate baseline-2)
if [[ "${VALIDATE:-1}" == 1 ]]; then runs+=(validate baseline-3); fi
if [[ "${GROUP:-1}" == 1 ]]; then runs+=(group baseline-4); fi
for run in "${runs[@]}"; do
    target "$run"
    say "$run: wrk -c$connections -t$threads -d$duration https://127.0.0.1:$port$path"
    load "$run" "$pid" "$port" "$path" "$duration"
done

# --- report ------------------------------------------------------------------------------------
mean() { printf '%s\n' "$@" | awk '{ s += $1 } END { printf "%.2f", s / NR }'; }
base_rps=() base_cpu=()
for run in "${runs[@]}"; do
    if [[ "$run" == baseline-* ]]; then
        base_rps+=("$(rps "$run")")
        base_cpu+=("$(cpu_us "$run")")
    fi
done
base_mean="$(mean "${base_rps[@]}")"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }

echo
echo "HTTPS AdmissionReview benchmark: $(nproc) CPUs, wrk -c$connections -t$threads -d$duration," \
    "body $(wc -c <"$review") bytes"
printf '%-12s %-28s %12s %10s %10s %8s %12s\n' run path req/s p50_ms p99_ms ratio cpu_us/req
for run in "${runs[@]}"; do
    target "$run"
    r="$(rps "$run")"
    printf '%-12s %-28s %12s %10s %10s %8s %12s\n' "$run" "$path" "$r" \
        "$(latency_ms "$run" 50%)" "$(latency_ms "$run" 99%)" "$(ratio "$r" "$base_mean")" \
        "$(cpu_us "$run")"
done
printf '%-12s %-28s %12s %10s %10s %8s %12s\n' baseline mean "$base_mean" "" "" "" "$(mean "${base_cpu[@]}")"
echo "load average before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg)" \
    "(other CPU consumers skew req/s; cpu_us/req, the server's own CPU time, much less)"
echo
printf '%-10s %14s %14s %14s\n' server idle_rss_kB rss_kB peak_rss_kB
printf '%-10s %14s %14s %14s\n' baseline "$base_idle_rss" "$(rss "$base_pid" VmRSS)" "$(rss "$base_pid" VmHWM)"
printf '%-10s %14s %14s %14s\n' gatehouse "$gate_idle_rss" "$(rss "$gate_pid" VmRSS)" "$(rss "$gate_pid" VmHWM)"
if [[ "${GROUP:-1}" == 1 ]]; then
    printf '%-10s %14s %14s %14s\n' group "-" "$(rss "$group_pid" VmRSS)" "$(rss "$group_pid" VmHWM)"
fi
echo
mutate_ratio="$(ratio "$(rps mutate)" "$base_mean")"
verdict="$(awk -v r="$mutate_ratio" 'BEGIN { print (r >= 0.7 ? "meets" : "BELOW") }')"
echo "throughput ratio gatehouse ($mutate_path) / baseline mean: $mutate_ratio ($verdict the 0.7 goal)"
if [[ "${GROUP:-1}" == 1 ]]; then
    group_ratio="$(ratio "$(rps group)" "$base_mean")"
    verdict="$(awk -v r="$group_ratio" 'BEGIN { print (r >= 0.6 ? "meets" : "BELOW") }')"
    echo "throughput ratio group of eight ($group_path) / baseline mean: $group_ratio ($verdict the 0.6 goal)"
fi
