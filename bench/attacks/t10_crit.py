"""Test 10: properly signed attestations whose header carries crit / b64 (heartbeat)."""
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *

r = register("crit-" + uuid.uuid4().hex[:8])

def claims():
    now = int(time.time())
    return {"iss": r.id, "sub": r.id, "aud": "leasegate", "iat": now, "exp": now + 60,
            "jti": str(uuid.uuid4()), "probe": {"ok": True, "runtime": "podman", "checked_at": now},
            "image": {"id": IMAGE}}

def compact(header, payload_segment: bytes):
    h = b64u(json.dumps(header, separators=(",", ":")).encode())
    signing_input = h.encode() + b"." + payload_segment
    sig = r.key.sign(signing_input)
    return (signing_input + b"." + b64u(sig).encode()).decode()

base = {"alg": "EdDSA", "typ": "leasegate-attestation+jwt", "kid": r.id}
pl = lambda: b64u(json.dumps(claims(), separators=(",", ":")).encode()).encode()
cases = [
    ("control: plain header", compact(dict(base), pl())),
    ('crit ["foo"], foo: 1', compact(dict(base, crit=["foo"], foo=1), pl())),
    ('b64: false, crit ["b64"] (raw JSON payload in the middle)', compact(dict(base, b64=False, crit=["b64"]), json.dumps(claims(), separators=(",", ":")).encode())),
    ('b64: false, crit ["b64"], payload b64url-encoded anyway', compact(dict(base, b64=False, crit=["b64"]), pl())),
    ('b64: true, crit ["b64"]', compact(dict(base, b64=True, crit=["b64"]), pl())),
    ('b64: false without crit', compact(dict(base, b64=False), pl())),
    ('crit: [] (empty)', compact(dict(base, crit=[]), pl())),
    ('crit ["exp"] (registered name)', compact(dict(base, crit=["exp"], exp=1), pl())),
]
for label, tok in cases:
    s, j = jreq("POST", "/api/v1/runners/heartbeat", {"attestation": tok})
    print(f"{label}: {s} {j.get('code') if isinstance(j, dict) else j} | {j.get('detail') if isinstance(j, dict) else ''} | status={j.get('status') if isinstance(j, dict) else ''}")
