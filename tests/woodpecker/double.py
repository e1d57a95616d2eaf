"""A Woodpecker server double and a Woodpecker agent's calls, over real gRPC (grpcio), for
tests/woodpecker.rs.

  double.py server GEN_DIR RECORD_FILE
      Serves proto.Woodpecker on 127.0.0.1 (h2c), prints `PORT <n>` and records every call,
      one JSON line each, in RECORD_FILE: {"call": "Next", "agent_id": N, "labels": {...}}.
      Next answers at once with workflow "wf-<agent_id>", unless its filter's label `wait` is
      `yes`: then it waits (as a server with no work does) until the call is cancelled, which
      it records as {"call": "Next", "event": "cancelled", ...}, or 30 s pass.

  double.py client GEN_DIR TARGET METHOD AGENT_ID [LABEL=VALUE ...]
      Makes one call as agent AGENT_ID (its `token` metadata a JWT whose payload holds
      `agent_id`, signed with a secret the double does not check) and prints the outcome as
      JSON: the status code, the workflow (Next), the trailing metadata, the seconds it took.

GEN_DIR holds the modules grpc_tools.protoc generated from woodpecker.proto.
"""

import base64
import json
import sys
import threading
import time


def jwt(agent_id):
    def part(obj):
        raw = json.dumps(obj, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    claims = {"iss": "woodpecker", "sub": str(agent_id), "agent_id": agent_id,
              "exp": int(time.time()) + 3600}
    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


def agent_of(context):
    token = dict(context.invocation_metadata()).get("token", "")
    try:
        payload = token.split(".")[1]
        payload += "=" * (-len(payload) % 4)
        return json.loads(base64.urlsafe_b64decode(payload))["agent_id"]
    except Exception:
        return None


def server(gen_dir, record_file):
    sys.path.insert(0, gen_dir)
    from concurrent import futures

    import grpc
    import woodpecker_pb2 as pb
    import woodpecker_pb2_grpc as pb_grpc

    lock = threading.Lock()

    def record(**entry):
        with lock, open(record_file, "a") as f:
            f.write(json.dumps(entry) + "\n")

    class Woodpecker(pb_grpc.WoodpeckerServicer):
        def Version(self, request, context):
            record(call="Version", agent_id=agent_of(context))
            return pb.VersionResponse(grpc_version=9, server_version="double")

        def Next(self, request, context):
            agent = agent_of(context)
            labels = dict(request.filter.labels)
            record(call="Next", agent_id=agent, labels=labels)
            if labels.get("wait") == "yes":
                cancelled = threading.Event()
                context.add_callback(cancelled.set)
                if cancelled.wait(30) or not context.is_active():
                    record(call="Next", event="cancelled", agent_id=agent)
                return pb.NextResponse()
            payload = json.dumps({"stages": [{"steps": [{"name": "build"}]}]}).encode()
            return pb.NextResponse(
                workflow=pb.Workflow(id=f"wf-{agent}", timeout=3600, payload=payload))

        def _plain(self, name, request, context):
            record(call=name, agent_id=agent_of(context), id=getattr(request, "id", None))
            context.set_trailing_metadata((("x-double", name),))
            return pb.Empty()

        def Init(self, request, context):
            return self._plain("Init", request, context)

        def Wait(self, request, context):
            return self._plain("Wait", request, context)

        def Done(self, request, context):
            return self._plain("Done", request, context)

        def Extend(self, request, context):
            return self._plain("Extend", request, context)

        def Update(self, request, context):
            return self._plain("Update", request, context)

        def Log(self, request, context):
            record(call="Log", agent_id=agent_of(context),
                   lines=[e.data.decode() for e in request.logEntries])
            return pb.Empty()

    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pb_grpc.add_WoodpeckerServicer_to_server(Woodpecker(), srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    print(f"PORT {port}", flush=True)
    # Until the test closes our stdin (or dies).
    sys.stdin.read()
    srv.stop(0)


def client(gen_dir, target, method, agent_id, labels):
    sys.path.insert(0, gen_dir)
    import grpc
    import woodpecker_pb2 as pb
    import woodpecker_pb2_grpc as pb_grpc

    metadata = (("token", jwt(int(agent_id))),)
    started = time.monotonic()
    out = {"method": method}
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.WoodpeckerStub(channel)
        requests = {
            "Next": pb.NextRequest(filter=pb.Filter(labels=labels)),
            "Init": pb.InitRequest(id="wf-1", state=pb.WorkflowState(started=1)),
            "Update": pb.UpdateRequest(id="wf-1", state=pb.StepState(step_uuid="s1")),
            "Log": pb.LogRequest(logEntries=[pb.LogEntry(step_uuid="s1", line=1, data=b"hello")]),
            "Done": pb.DoneRequest(id="wf-1", state=pb.WorkflowState(finished=2)),
            "Wait": pb.WaitRequest(id="wf-1"),
            "Extend": pb.ExtendRequest(id="wf-1"),
        }
        try:
            response, call = getattr(stub, method).with_call(
                requests[method], metadata=metadata, timeout=60)
            out["code"] = "OK"
            out["trailing"] = {k: v for k, v in call.trailing_metadata()}
            out["initial"] = {k: v for k, v in call.initial_metadata()}
            if method == "Next":
                w = response.workflow if response.HasField("workflow") else None
                out["workflow"] = None if w is None else {
                    "id": w.id, "timeout": w.timeout, "payload": w.payload.decode()}
        except grpc.RpcError as e:
            out["code"] = e.code().name
            out["details"] = e.details()
            out["trailing"] = {k: v for k, v in (e.trailing_metadata() or ())}
    out["seconds"] = time.monotonic() - started
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2], sys.argv[3])
    else:
        labels = dict(a.split("=", 1) for a in sys.argv[6:])
        client(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], labels)
