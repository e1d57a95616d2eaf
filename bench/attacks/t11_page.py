"""Test 11: page session logout, security headers on 401/404, bidi-override runner name."""
import os
import re, sys
from urllib.parse import urlencode
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
s, h, b = req("POST", "/admin/login", raw=urlencode({"token": ADMIN}).encode(), headers=FORM)
print("login:", s, "location:", h.get("location"), "set-cookie:", h.get("set-cookie"))
cookie = h["set-cookie"].split(";")[0]
s, h, b = req("GET", "/admin", headers={"Cookie": cookie})
m = re.search(rb'name="csrf"\s+value="([^"]+)"', b) or re.search(rb'value="([^"]+)"\s+name="csrf"', b)
print("GET /admin with cookie:", s, "len", len(b), "csrf found:", bool(m))
csrf = m.group(1).decode()
# logout without csrf first (should be refused)
s, h, b = req("POST", "/admin/logout", raw=b"", headers={**FORM, "Cookie": cookie})
print("logout WITHOUT csrf:", s, b[:200])
s, h, b = req("GET", "/admin", headers={"Cookie": cookie})
print("   cookie still valid after refused logout:", s)
s, h, b = req("POST", "/admin/logout", raw=urlencode({"csrf": csrf}).encode(), headers={**FORM, "Cookie": cookie})
print("logout with csrf:", s, "location:", h.get("location"), "set-cookie:", h.get("set-cookie"))
for path in ["/admin", "/admin/fleet"]:
    s, h, b = req("GET", path, headers={"Cookie": cookie})
    print(f"reuse old cookie on GET {path}:", s, "location:", h.get("location"))
s, h, b = req("POST", "/admin/runners/00000000-0000-0000-0000-000000000000/cordon",
              raw=urlencode({"csrf": csrf}).encode(), headers={**FORM, "Cookie": cookie})
print("reuse old cookie + old csrf on POST cordon:", s, h.get("location"))

for label, (m_, p, tok) in {"401 GET /api/v1/admin/pools (no token)": ("GET", "/api/v1/admin/pools", None),
                           "404 GET /nowhere": ("GET", "/nowhere", None),
                           "405 DELETE /readyz": ("DELETE", "/readyz", None),
                           "200 GET /readyz": ("GET", "/readyz", None)}.items():
    s, h, b = req(m_, p, token=tok)
    print(f"{label}: status {s}; X-Content-Type-Options={h.get('x-content-type-options')!r}; "
          f"Content-Security-Policy={h.get('content-security-policy')!r}; Referrer-Policy={h.get('referrer-policy')!r}; "
          f"WWW-Authenticate={h.get('www-authenticate')!r}")
# 431 from the HTTP layer
s, h, b = req("GET", "/readyz", headers={"X-Big": "a" * 9000})
print(f"431 (9 KB header): status {s}; X-Content-Type-Options={h.get('x-content-type-options')!r}; CSP={h.get('content-security-policy')!r}")

for name in ["build-\u202e10", "build-\u200b10", "build-\u2066x\u2069", "build-\u00e910 (e-acute, allowed?)"]:
    s, j = jreq("POST", "/api/v1/runners", {"registration_token": reg_token(), "name": name,
                "public_key": {"kty": "OKP", "crv": "Ed25519", "x": b64u(Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))}})
    print(f"register name {name!r}: {s} {j.get('code') if isinstance(j, dict) and 'code' in j else ''} {j.get('detail') if isinstance(j, dict) and 'detail' in j else ''}")
