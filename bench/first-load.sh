#!/usr/bin/env bash
# Measures the runner-health page's first load in a real headless Chromium: a `leasegate serve`
# of its own (temporary SQLite file) is filled with RUNNERS healthy and BROKEN broken runners by
# `leasegate bench --phases page` (each runner attests once; its server-side figures are kept),
# then chromedriver loads /admin LOADS times with the browser cache cleared (cold) and LOADS
# times with it warm, and reads the Navigation Timing entry of each load.
#
#   bench/first-load.sh [--screenshot PATH]
#   RUNNERS=10000 BROKEN=200 LOADS=5 PORT=18181 bench/first-load.sh   (these are the defaults,
#                                                                       but for PORT: a free one)
#
# "first load" is the median loadEventEnd of the cold loads (ms since navigation start).
# Writes target/bench-first-load.json. Needs a release build (built if missing), python3 and
# Debian's chromium and chromium-driver. Listens on 127.0.0.1 only; stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
screenshot=""
[[ "${1:-}" == "--screenshot" ]] && screenshot="$(realpath -m "${2:?--screenshot needs a PATH}")"
runners="${RUNNERS:-10000}" broken="${BROKEN:-200}" loads="${LOADS:-5}"
if [[ ! -x /usr/bin/chromium || ! -x /usr/bin/chromedriver ]]; then
  echo "first-load.sh needs /usr/bin/chromium and /usr/bin/chromedriver:" >&2
  echo "  apt-get install chromium chromium-driver" >&2
  exit 2
fi
if [[ ! -x target/release/leasegate ]]; then
  # A build already under way (another shell) is waited for rather than started twice.
  while pgrep -f "cargo build" >/dev/null; do sleep 5; done
  [[ -x target/release/leasegate ]] || cargo build --release
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port="${PORT:-$(free_port)}" driver_port="$(free_port)"
dir="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$dir"' EXIT
export LEASEGATE_ADMIN_TOKEN="$(openssl rand -hex 32)" LEASEGATE_FORGE_TOKEN="$(openssl rand -hex 32)"
RUST_LOG=warn ./target/release/leasegate serve --listen "127.0.0.1:$port" \
  --database-url "sqlite://$dir/first-load.db" >"$dir/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
echo "filling the service with $runners healthy and $broken broken runners…" >&2
started=$SECONDS
timeout 1200 ./target/release/leasegate bench --server "http://127.0.0.1:$port" \
  --runners "$runners" --broken "$broken" --jobs 100 --phases page --quiet --json "$dir/page.json" \
  >"$dir/bench.log" 2>&1 || { cat "$dir/bench.log" >&2; exit 1; }
echo "filled in $((SECONDS - started)) s" >&2
/usr/bin/chromedriver --port="$driver_port" >"$dir/chromedriver.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$driver_port/status" >/dev/null 2>&1 && break
  sleep 0.1
done
mkdir -p target
BASE="http://127.0.0.1:$port" DRIVER="http://127.0.0.1:$driver_port" LOADS="$loads" \
  PAGE_JSON="$dir/page.json" OUT=target/bench-first-load.json SCREENSHOT="$screenshot" \
  timeout 600 python3 - <<'PY'
import base64, json, os, statistics, urllib.request

driver, base, loads = os.environ["DRIVER"], os.environ["BASE"], int(os.environ["LOADS"])

def wd(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(driver + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=180) as r:
        return json.load(r)["value"]

args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000"]
sid = wd("POST", "/session", {"capabilities": {"alwaysMatch": {
    "browserName": "chrome", "timeouts": {"pageLoad": 120000, "script": 30000},
    "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}}}})["sessionId"]
s = f"/session/{sid}"
try:
    wd("POST", s + "/url", {"url": f"{base}/admin/login?token={os.environ['LEASEGATE_ADMIN_TOKEN']}"})
    assert wd("GET", s + "/url").rstrip("/").endswith("/admin"), "login did not land on /admin"
    # Read once the first contentful paint is reported (at most 3 s after the load).
    timing = """const done = arguments[0];
      const report = (_, __, timedOut) => {
        const fcp = performance.getEntriesByName('first-contentful-paint')[0];
        if (!fcp && !timedOut) return;
        const n = performance.getEntriesByType('navigation')[0].toJSON();
        const res = performance.getEntriesByType('resource').map(r => ({name: r.name, start: r.startTime,
          end: r.responseEnd, transferSize: r.transferSize, decodedBodySize: r.decodedBodySize}));
        done({nav: n, fcp: fcp ? fcp.startTime : null, resources: res,
              elements: document.getElementsByTagName('*').length});
      };
      new PerformanceObserver(report).observe({type: 'paint', buffered: true});
      setTimeout(() => report(null, null, true), 3000);"""
    keys = ["responseStart", "responseEnd", "domInteractive", "domContentLoadedEventEnd", "loadEventEnd"]
    runs = []
    for cold in [True, False] * loads:  # alternated, so that drift touches both alike
        wd("POST", s + "/url", {"url": "about:blank"})
        if cold:  # chromedriver's CDP passthrough
            wd("POST", s + "/goog/cdp/execute", {"cmd": "Network.clearBrowserCache", "params": {}})
        wd("POST", s + "/url", {"url": f"{base}/admin"})  # returns once the load event is done
        t = wd("POST", s + "/execute/async", {"script": timing, "args": []})
        run = {"cold": cold, **{k: round(t["nav"][k], 1) for k in keys},
               "transferSize": t["nav"]["transferSize"], "decodedBodySize": t["nav"]["decodedBodySize"],
               "firstContentfulPaint": t["fcp"] and round(t["fcp"], 1),
               "elements": t["elements"], "resources": t["resources"]}
        runs.append(run)
    if os.environ["SCREENSHOT"]:
        with open(os.environ["SCREENSHOT"], "wb") as f:
            f.write(base64.b64decode(wd("GET", s + "/screenshot")))
finally:
    wd("DELETE", s)

page = json.load(open(os.environ["PAGE_JSON"])).get("page")
def med(cold, k):
    xs = [r[k] for r in runs if r["cold"] == cold and r[k] is not None]
    return statistics.median(xs) if xs else None

summary = {"runners": page and page["runners"], "server_page": page,
           "first_load_ms": med(True, "loadEventEnd"), "warm_load_ms": med(False, "loadEventEnd"),
           "median_cold": {k: med(True, k) for k in keys + ["firstContentfulPaint"]},
           "median_warm": {k: med(False, k) for k in keys + ["firstContentfulPaint"]}, "loads": runs}
json.dump(summary, open(os.environ["OUT"], "w"), indent=2)

print(f"runners: {summary['runners']}   server: GET /admin {page['fleet_page_ms']:.1f} ms mean, "
      f"{page['fleet_page_bytes']} B; refresh {page['refresh_bytes']} B; "
      f"runner list {page['runner_list_ms']:.1f} ms, {page['runner_list_bytes']} B")
print(f"{'load':<6}{'respStart':>10}{'respEnd':>10}{'domInter':>10}{'DCLEnd':>10}{'loadEnd':>10}"
      f"{'FCP':>8}{'transfer':>10}{'decoded':>10}")
for i, r in enumerate(runs):
    print(f"{('cold' if r['cold'] else 'warm') + str(i // 2 + 1):<6}{r['responseStart']:>10}"
          f"{r['responseEnd']:>10}{r['domInteractive']:>10}{r['domContentLoadedEventEnd']:>10}"
          f"{r['loadEventEnd']:>10}{str(r['firstContentfulPaint']):>8}{r['transferSize']:>10}{r['decodedBodySize']:>10}")
for r in runs[0]["resources"]:
    print(f"  cold1 resource {r['name'].removeprefix(base)}: {r['start']:.1f}–{r['end']:.1f} ms, "
          f"{r['transferSize']} B transferred")
print(f"first load (median cold loadEventEnd): {summary['first_load_ms']} ms;"
      f" warm cache: {summary['warm_load_ms']} ms   (target/bench-first-load.json)")
PY
[[ -n "$screenshot" ]] && echo "screenshot: $screenshot" >&2
exit 0
