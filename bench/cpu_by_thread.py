"""Where one phase of `leasegate bench` spends the machine's CPU: the bench's own threads by
name and every PostgreSQL process, each as cores used and as microseconds per request.

    python3 bench/cpu_by_thread.py -- BINARY bench --quiet --phases PHASE [bench options...]

Runs the bench command given after `--` (one phase only), reads `/proc/PID/task/*/stat` of its
threads and `/proc/*/stat` of every `postgres` process every half second, and reports the
window in which the phase ran: the longest run of half-seconds in which the thread that writes
the rounds worked (`pg-rounds` on PostgreSQL, `sqlite-writer` on SQLite). The
phase's rate is read from the bench's own line for it. What no thread used of the machine's
cores in that window is printed as idle.

The figures are CPU time the kernel accounted to each thread (user and system), so they do not
move with the machine's other load as a rate does; the bench's clients share the
`tokio-rt-worker` threads with the service's handlers (in-process), so those threads' figure is
both sides of each request.
"""

import json
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
PERIOD = 0.5


def ticks(stat_path):
    try:
        with open(stat_path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def snapshot(pid):
    """CPU ticks so far per group: the bench's threads by name, and `postgres` (all its
    processes: the backends, the WAL writer, the checkpointer)."""
    groups = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        name = read(f"/proc/{pid}/task/{tid}/comm")
        used = ticks(f"/proc/{pid}/task/{tid}/stat")
        if name is not None and used is not None:
            groups[name.strip()] = groups.get(name.strip(), 0) + used
    for p in filter(str.isdigit, os.listdir("/proc")):
        if (read(f"/proc/{p}/comm") or "").strip() == "postgres":
            used = ticks(f"/proc/{p}/stat")
            if used is not None:
                groups["postgres"] = groups.get("postgres", 0) + used
    return groups


def main():
    if "--" not in sys.argv:
        sys.exit(__doc__)
    command = sys.argv[sys.argv.index("--") + 1 :]
    bench = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    samples = []
    while bench.poll() is None:
        try:
            samples.append((time.monotonic(), snapshot(bench.pid)))
        except FileNotFoundError:
            break
        time.sleep(PERIOD)
    output = bench.stdout.read()
    sys.stdout.write(output)
    rates = [line.split() for line in output.splitlines() if line[:1].isalpha()]
    phase = [r for r in rates if len(r) > 3 and r[1].isdigit() and r[3].isdigit()]
    if len(phase) != 1:
        sys.exit("cpu_by_thread: run exactly one phase (--phases NAME)")
    name, rate = phase[0][0], float(phase[0][3])

    marker = "pg-rounds" if any("pg-rounds" in s for _, s in samples) else "sqlite-writer"
    busy = [
        samples[i][1].get(marker, 0) - samples[i - 1][1].get(marker, 0) > PERIOD * TICK / 20
        for i in range(1, len(samples))
    ]
    # The longest run of half-seconds in which the marker worked: the phase (the fleet's
    # making before it may keep the writer busy for a moment too).
    best, start = (0, 0), None
    for i, b in enumerate(busy + [False]):
        if b and start is None:
            start = i
        elif not b and start is not None:
            best = max(best, (i - start, start))
            start = None
    length, start = best
    if length < 3:
        sys.exit(f"cpu_by_thread: found no window in which {marker} worked")
    # Interval i runs from sample i to sample i + 1. The phase's whole half-seconds only: the
    # first and last busy ones may be partly outside it.
    (t0, first), (t1, last) = samples[start + 1], samples[start + length - 1]
    seconds = t1 - t0
    cores = os.cpu_count()
    used = {
        g: (last.get(g, 0) - first.get(g, 0)) / TICK / seconds for g in set(first) | set(last)
    }
    print(f"\n{name}: {rate:,.0f} a second; CPU in {seconds:.1f} s of the phase (from /proc):")
    print(f"  {'threads':<18} {'cores':>6} {'us per request':>15}")
    for group, c in sorted(used.items(), key=lambda kv: -kv[1]):
        if c >= 0.005:
            print(f"  {group:<18} {c:6.2f} {c / rate * 1e6:15.0f}")
    total = sum(used.values())
    print(f"  {'all':<18} {total:6.2f} {total / rate * 1e6:15.0f}")
    print(f"  {'idle':<18} {cores - total:6.2f}   (of {cores} cores)")
    print(json.dumps({"phase": name, "rate": rate, "seconds": seconds, "cores": used}))


if __name__ == "__main__":
    main()
