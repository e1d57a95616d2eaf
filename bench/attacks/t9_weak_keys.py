"""Test 9: register runners with weak public keys."""
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *
cases = {
    "identity point (0x01 + 31 zero bytes)": b64u(b"\x01" + b"\x00" * 31),
    "all-zero (32 zero bytes)": b64u(b"\x00" * 32),
    # extra: other small-order points / non-canonical encodings
    "order-2 point (y = -1: ec ff..ff 7f)": b64u(bytes([0xec] + [0xff] * 30 + [0x7f])),
    "non-canonical identity (y = p+1)": b64u(bytes([0xee] + [0xff] * 30 + [0x7f])),
    "identity with sign bit (01 00..00 80)": b64u(b"\x01" + b"\x00" * 30 + b"\x80"),
}
for label, x in cases.items():
    tok = reg_token()
    s, j = jreq("POST", "/api/v1/runners", {"registration_token": tok, "name": "weak-" + uuid.uuid4().hex[:8],
                "public_key": {"kty": "OKP", "crv": "Ed25519", "x": x}})
    print(f"{label}: x={x} -> {s} {j.get('code') if isinstance(j, dict) else j}: {j.get('detail') if isinstance(j, dict) else ''}")
    # token not spent?
    s2, j2 = jreq("POST", "/api/v1/runners", {"registration_token": tok, "name": "after-" + uuid.uuid4().hex[:8],
                  "public_key": {"kty": "OKP", "crv": "Ed25519", "x": b64u(Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))}})
    print(f"   same token reused with a good key -> {s2} (token not spent by the refusal: {s2 == 201})")
