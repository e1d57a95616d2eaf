"""Test 7: NUL bytes (PostgreSQL): kid, path ids, idempotency_key, and a few more fields."""
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *
put_pool("linux")
r = register("nul-" + uuid.uuid4().hex[:6])
# a real lease for the lease-id cases
enqueue("linux")
s, L = jreq("POST", "/api/v1/lease", {"attestation": r.attest(), "wait_s": 2})
assert s == 200, (s, L)
ltok = L["lease_token"]

def show(label, s, j):
    code = j.get("code") if isinstance(j, dict) else None
    det = j.get("detail") if isinstance(j, dict) else j
    print(f"{label}: {s} {code} | {det}")

show("kid = runner_id + \\u0000 (heartbeat)", *jreq("POST", "/api/v1/runners/heartbeat", {"attestation": r.attest(headers={"kid": r.id + "\u0000"})}))
show("kid = \\u0000 only (heartbeat)", *jreq("POST", "/api/v1/runners/heartbeat", {"attestation": r.attest(headers={"kid": "\u0000"})}))
show("kid with \\u0000 (lease)", *jreq("POST", "/api/v1/lease", {"attestation": r.attest(headers={"kid": "a\u0000b"})}))
show("kid with \\u0000 (gate/check)", *jreq("POST", "/api/v1/gate/check", {"attestation": r.attest(headers={"kid": "a\u0000b"})}, token=FORGE))
show("jti with \\u0000 (heartbeat)", *jreq("POST", "/api/v1/runners/heartbeat", {"attestation": r.attest(claims={"jti": "0123456789abcdef\u0000x"})}))
for op in ("start", "extend", "complete", "abandon"):
    show(f"lease id %00 (POST /api/v1/leases/%00/{op})", *jreq("POST", f"/api/v1/leases/%00/{op}", {"outcome": "succeeded"}, token=ltok))
show("lease id x%00y (start)", *jreq("POST", "/api/v1/leases/x%00y/start", None, token=ltok))
show("job id %00 (GET /api/v1/jobs/%00)", *jreq("GET", "/api/v1/jobs/%00", token=FORGE))
show("job id %00 (POST /api/v1/jobs/%00/cancel)", *jreq("POST", "/api/v1/jobs/%00/cancel", token=FORGE))
show("runner id %00 (GET /api/v1/admin/runners/%00)", *jreq("GET", "/api/v1/admin/runners/%00", token=ADMIN))
for op in ("cordon", "uncordon", "revoke"):
    show(f"runner id %00 (POST /api/v1/admin/runners/%00/{op})", *jreq("POST", f"/api/v1/admin/runners/%00/{op}", token=ADMIN))
show("page: GET /admin/runners/%00", *jreq("GET", "/admin/runners/%00", token=ADMIN))
show("page: GET /admin/jobs/%00", *jreq("GET", "/admin/jobs/%00", token=ADMIN))
show("pool name %00 (GET /api/v1/admin/pools/%00)", *jreq("GET", "/api/v1/admin/pools/%00", token=ADMIN))
show("runner list ?pool=%00", *jreq("GET", "/api/v1/admin/runners?pool=%00", token=ADMIN))
show("idempotency_key = \\u0000", *jreq("POST", "/api/v1/jobs", {"pool": "linux", "idempotency_key": "\u0000"}, token=FORGE))
show("idempotency_key = push-\\u0000-1", *jreq("POST", "/api/v1/jobs", {"pool": "linux", "idempotency_key": "push-\u0000-1"}, token=FORGE))
show("payload with \\u0000 in a string (stored as JSON)", *jreq("POST", "/api/v1/jobs", {"pool": "linux", "payload": {"s": "a\u0000b"}}, token=FORGE))
show("payload with \\u0000 in a key", *jreq("POST", "/api/v1/jobs", {"pool": "linux", "payload": {"a\u0000": 1}}, token=FORGE))
show("pool \\u0000 in enqueue", *jreq("POST", "/api/v1/jobs", {"pool": "lin\u0000ux"}, token=FORGE))
show("image_ref with \\u0000 (PUT pool)", *jreq("PUT", "/api/v1/admin/pools/nulpool", {"image_ref": "a\u0000b", "expected_image_ids": [IMAGE]}, token=ADMIN))
show("registration name with \\u0000", *jreq("POST", "/api/v1/runners", {"registration_token": reg_token(), "name": "a\u0000b", "public_key": {"kty": "OKP", "crv": "Ed25519", "x": b64u(b'\x11' * 32)}}))
show("label value with \\u0000", *jreq("POST", "/api/v1/runners", {"registration_token": reg_token(), "name": "lbl-" + uuid.uuid4().hex[:6], "labels": {"k": "v\u0000"}, "public_key": {"kty": "OKP", "crv": "Ed25519", "x": b64u(Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))}}))
show("probe.error with \\u0000 (cleaned, heartbeat)", *jreq("POST", "/api/v1/runners/heartbeat", {"attestation": r.attest(claims={"probe": {"ok": False, "runtime": "pod\u0000man", "checked_at": time.time(), "error": "x\u0000y"}})}))
show("agent (free-form, stored as sent) with \\u0000", *jreq("POST", "/api/v1/runners/heartbeat", {"attestation": r.attest(claims={"agent": {"name": "a\u0000b"}})}))
show("complete message with \\u0000", *jreq("POST", f"/api/v1/leases/{L['lease_id']}/abandon", {"reason": "r\u0000", "message": "m\u0000"}, token=ltok))
show("registration_token with \\u0000", *jreq("POST", "/api/v1/runners", {"registration_token": "lgr_\u0000", "name": "zz", "public_key": {"kty": "OKP", "crv": "Ed25519", "x": b64u(Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))}}))
show("registry event repository with \\u0000", *jreq("POST", "/api/v1/admin/registry-events", {"events": [{"action": "push", "target": {"repository": "a\u0000", "tag": "t\u0000", "digest": IMAGE}}]}, token=ADMIN))
