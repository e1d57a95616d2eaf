"""Shared helpers for the leasegate attack scripts (stdlib + pyjwt + cryptography).

Environment: LG (base URL, default http://127.0.0.1:18080), LG_ADMIN, LG_FORGE.
"""
import asyncio
import base64
import http.client
import json
import os
import time
import uuid
from urllib.parse import urlparse

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives import serialization

LG = os.environ.get("LG", "http://127.0.0.1:18080")
U = urlparse(LG)
HOST, PORT = U.hostname, U.port
ADMIN = os.environ.get("LG_ADMIN", "")
FORGE = os.environ.get("LG_FORGE", "")
IMAGE = "sha256:" + "2f1c9b0e7d4a3c5b6e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d"


def b64u(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def req(method, path, body=None, token=None, headers=None, raw=None, source=None, timeout=60):
    """Synchronous request. Returns (status, headers dict (lower), body bytes)."""
    c = http.client.HTTPConnection(HOST, PORT, timeout=timeout,
                                   source_address=(source, 0) if source else None)
    h = dict(headers or {})
    if token:
        h["Authorization"] = "Bearer " + token
    data = raw
    if body is not None:
        data = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    b = r.read()
    hd = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    return r.status, hd, b


def jreq(*a, **k):
    s, h, b = req(*a, **k)
    try:
        j = json.loads(b) if b else None
    except Exception:
        j = b.decode(errors="replace")
    return s, j


def put_pool(name="linux"):
    return jreq("PUT", f"/api/v1/admin/pools/{name}",
                {"image_ref": "registry.example/ci/runner:stable", "expected_image_ids": [IMAGE]},
                token=ADMIN)


def reg_token(pool="linux"):
    s, j = jreq("POST", f"/api/v1/admin/pools/{pool}/registration-tokens", {"ttl_s": 3600}, token=ADMIN)
    assert s == 201, (s, j)
    return j["token"]


class Runner:
    def __init__(self, runner_id, key):
        self.id = runner_id
        self.key = key

    def attest(self, headers=None, claims=None, image_id=IMAGE):
        now = int(time.time())
        c = {
            "iss": self.id, "sub": self.id, "aud": "leasegate",
            "iat": now, "exp": now + 60, "jti": str(uuid.uuid4()),
            "probe": {"ok": True, "runtime": "podman", "checked_at": time.time()},
            "image": {"id": image_id},
        }
        if claims:
            c.update(claims)
        h = {"typ": "leasegate-attestation+jwt", "kid": self.id}
        if headers:
            h.update(headers)
        return jwt.encode(c, self.key, algorithm="EdDSA", headers=h)


def register(name, pool="linux", x=None):
    key = Ed25519PrivateKey.generate()
    if x is None:
        x = b64u(key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    s, j = jreq("POST", "/api/v1/runners", {
        "registration_token": reg_token(pool), "name": name,
        "public_key": {"kty": "OKP", "crv": "Ed25519", "x": x}, "labels": {"os": "linux"}})
    if s != 201:
        return s, j
    return Runner(j["runner_id"], key)


def enqueue(pool="linux", key=None):
    b = {"pool": pool, "payload": {"script": "make test"}}
    if key:
        b["idempotency_key"] = key
    return jreq("POST", "/api/v1/jobs", b, token=FORGE)


# ---- raw asyncio HTTP ----------------------------------------------------------------------

async def aread_response(reader):
    """Read one HTTP/1.1 response (Content-Length or close delimited). Returns (status, headers, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin1").split("\r\n")
    status = int(lines[0].split()[1])
    hd = {}
    for ln in lines[1:]:
        if ":" in ln:
            k, v = ln.split(":", 1)
            hd[k.strip().lower()] = v.strip()
    if "content-length" in hd:
        body = await reader.readexactly(int(hd["content-length"]))
    elif hd.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            szl = await reader.readuntil(b"\r\n")
            sz = int(szl.strip().split(b";")[0], 16)
            if sz == 0:
                await reader.readuntil(b"\r\n")
                break
            body += await reader.readexactly(sz)
            await reader.readexactly(2)
    else:
        body = await reader.read()
    return status, hd, body


async def areq(method, path, body=b"", headers=None, source=None, keep=False):
    r, w = await asyncio.open_connection(HOST, PORT, local_addr=(source, 0) if source else None)
    h = {"Host": f"{HOST}:{PORT}", "Content-Length": str(len(body))}
    if not keep:
        h["Connection"] = "close"
    h.update(headers or {})
    msg = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    w.write(msg.encode("latin1") + body)
    await w.drain()
    res = await aread_response(r)
    if keep:
        return res, r, w
    w.close()
    return res


def pctl(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
