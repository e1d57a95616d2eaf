"""The README's walk-through, driven by a Python client generated from /openapi.json.

Run by .ci/python_client.sh with the generated package `leasegate_client` on the path and
LEASEGATE_URL, LEASEGATE_ADMIN_TOKEN and LEASEGATE_FORGE_TOKEN set. It creates a pool, a
registration token, registers a runner with an Ed25519 key, heartbeats, enqueues a job,
leases it, starts and completes it, and reads the job: every request and answer goes
through the generated models, so a document that does not say what the server does fails
here. Attestations are signed as docs/PROTOCOL.md, "The attestation", describes.
"""

import base64
import json
import os
import sys
import time
import uuid

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from leasegate_client import AuthenticatedClient, Client
from leasegate_client.api.admin import create_registration_token, put_pool
from leasegate_client.api.forge import enqueue, read
from leasegate_client.api.leasing import complete, lease, start
from leasegate_client.api.runners import heartbeat, register
from leasegate_client.models import (
    AttestationBody,
    CompleteBody,
    EnqueueBody,
    Heartbeat,
    Jwk,
    JobSummary,
    JobView,
    LeaseBody,
    LeaseGrant,
    LeaseView,
    Outcome,
    PoolBodyType2,
    PoolView,
    RegisterBody,
    Registered,
    RegistrationToken,
    RegistrationTokenBody,
)

IMAGE_ID = "sha256:" + "ab" * 32


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def attestation(key: Ed25519PrivateKey, runner_id: str, audience: str) -> str:
    now = time.time()
    header = {"alg": "EdDSA", "typ": "leasegate-attestation+jwt", "kid": runner_id}
    claims = {
        "iss": runner_id,
        "sub": runner_id,
        "aud": audience,
        "iat": now,
        "exp": now + 60,
        "jti": uuid.uuid4().hex,
        "probe": {"ok": True, "runtime": "podman", "runtime_version": "5.0.0", "checked_at": now},
        "image": {"id": IMAGE_ID},
        "agent": {"name": "python-client-walkthrough"},
    }
    signing_input = (
        b64url(json.dumps(header, separators=(",", ":")).encode())
        + "."
        + b64url(json.dumps(claims, separators=(",", ":")).encode())
    )
    return signing_input + "." + b64url(key.sign(signing_input.encode()))


def expect(response, model, status):
    """The parsed answer, after checking its status and that it parsed into `model`."""
    if response.status_code != status or not isinstance(response.parsed, model):
        sys.exit(
            f"expected {status} {model.__name__}, got {response.status_code}: {response.content!r}"
        )
    return response.parsed


def main() -> None:
    url = os.environ["LEASEGATE_URL"]
    admin = AuthenticatedClient(base_url=url, token=os.environ["LEASEGATE_ADMIN_TOKEN"])
    forge = AuthenticatedClient(base_url=url, token=os.environ["LEASEGATE_FORGE_TOKEN"])
    anonymous = Client(base_url=url)

    pool = expect(
        put_pool.sync_detailed("ci", client=admin, body=PoolBodyType2(expected_image_ids=[IMAGE_ID])),
        PoolView,
        201,
    )
    assert pool.name == "ci" and pool.expected_image_ids == [IMAGE_ID], pool

    token = expect(
        create_registration_token.sync_detailed(
            "ci", client=admin, body=RegistrationTokenBody(ttl_s=600)
        ),
        RegistrationToken,
        201,
    )

    key = Ed25519PrivateKey.generate()
    x = b64url(key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    runner = expect(
        register.sync_detailed(
            client=anonymous,
            body=RegisterBody(
                registration_token=token.token,
                name="runner-1",
                public_key=Jwk(kty="OKP", crv="Ed25519", x=x),
            ),
        ),
        Registered,
        201,
    )

    beat = expect(
        heartbeat.sync_detailed(
            client=anonymous,
            body=AttestationBody(attestation=attestation(key, runner.runner_id, runner.audience)),
        ),
        Heartbeat,
        200,
    )
    assert beat.status == "healthy" and beat.image_current is True, beat

    job = expect(
        enqueue.sync_detailed(
            client=forge,
            body=EnqueueBody(pool="ci", payload={"script": "make test"}, idempotency_key="walkthrough-1"),
        ),
        JobSummary,
        201,
    )

    grant = expect(
        lease.sync_detailed(
            client=anonymous,
            body=LeaseBody(attestation=attestation(key, runner.runner_id, runner.audience), wait_s=5),
        ),
        LeaseGrant,
        200,
    )
    assert grant.job.id == job.id and grant.job.attempt == 1, grant

    leased = AuthenticatedClient(base_url=url, token=grant.lease_token)
    started = expect(start.sync_detailed(grant.lease_id, client=leased), LeaseView, 200)
    assert started.state == "running", started
    done = expect(
        complete.sync_detailed(
            grant.lease_id,
            client=leased,
            body=CompleteBody(outcome=Outcome.SUCCEEDED, exit_code=0, message="all green"),
        ),
        LeaseView,
        200,
    )
    assert done.state == "completed", done

    story = expect(read.sync_detailed(job.id, client=forge), JobView, 200)
    assert story.state == "succeeded" and story.attempts == 1, story
    kinds = [e.kind for e in story.events]
    assert kinds == ["enqueued", "leased", "started", "completed"], kinds
    print(f"python client walk-through: job {story.id} {story.state}, events {kinds}")


if __name__ == "__main__":
    main()
