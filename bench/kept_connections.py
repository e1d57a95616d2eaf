"""What connections kept alive after a forwarded body cost a `leasegate serve`.

    python3 bench/kept_connections.py BINARY upload|download COUNT BYTES [--one-at-a-time]

Starts bench/outside_forge.py and BINARY's `serve` (embedded SQLite in a temporary directory,
127.0.0.1 only, the stand-in as its Forgejo), then opens COUNT connections to the service, sends
one body of BYTES each way asked (an upload with its length, or a download), reads the answer
and keeps the connection open; two seconds after the last, prints the service's resident memory
before and after (`/proc/PID/status`). With `--one-at-a-time` the transfers run one after the
other, so that only what each connection keeps adds up; otherwise all at once. Both processes
are stopped at the end.
"""

import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ARTIFACT = "/api/actions_pipeline/kept"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resident_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main():
    if len(sys.argv) < 5 or sys.argv[2] not in ("upload", "download"):
        sys.exit(__doc__)
    binary, way, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    one_at_a_time = "--one-at-a-time" in sys.argv[5:]
    here = os.path.dirname(os.path.abspath(__file__))
    forge_port, port = free_port(), free_port()
    work = tempfile.mkdtemp()
    forge = subprocess.Popen(
        [sys.executable, os.path.join(here, "outside_forge.py"), str(forge_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = dict(
        os.environ,
        RUST_LOG="warn",
        LEASEGATE_ADMIN_TOKEN="a" * 40,
        LEASEGATE_FORGE_TOKEN="f" * 40,
        LEASEGATE_FORGEJO_UPSTREAM=f"http://127.0.0.1:{forge_port}",
    )
    with open(os.path.join(work, "serve.log"), "w") as log:
        server = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{port}",
             "--database-url", f"sqlite://{work}/leasegate.db"],
            env=env, stdout=subprocess.DEVNULL, stderr=log,
        )
    try:
        for _ in range(100):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/readyz")
                c.getresponse().read()
                c.close()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(1)
        before = resident_mib(server.pid)
        body = b"x" * size
        kept, failures, lock = [], [], threading.Lock()

        def transfer():
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            if way == "upload":
                c.request("POST", f"{ARTIFACT}/upload", body=body,
                          headers={"content-type": "application/octet-stream"})
            else:
                c.request("GET", f"{ARTIFACT}/download/{size}")
            answer = c.getresponse()
            data = answer.read()
            with lock:
                if answer.status == 200:
                    kept.append(c)
                else:
                    failures.append((answer.status, data[:200]))

        threads = [threading.Thread(target=transfer) for _ in range(count)]
        for t in threads:
            t.start()
            if one_at_a_time:
                t.join()
        for t in threads:
            t.join()
        if failures:
            sys.exit(f"kept_connections: {len(failures)} transfers failed, first {failures[0]}")
        time.sleep(2)
        after = resident_mib(server.pid)
        print(f"{way} x{count} of {size} bytes{' one at a time' if one_at_a_time else ''}: "
              f"{before:.1f} -> {after:.1f} MiB (+{after - before:.1f}), "
              f"{len(kept)} connections kept")
    finally:
        server.kill()
        forge.kill()
        server.wait()
        forge.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
