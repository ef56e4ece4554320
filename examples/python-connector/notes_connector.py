#!/usr/bin/env python3
"""A small notes service that implements the aipfleet sidecar's local
connector contract (docs/sidecar-protocol.md), with the Python 3 standard
library only.

Run it under aip-sidecar, which gives it the connector-host lifecycle:

    aip-sidecar --local-socket /run/notes.sock --exec python3 notes_connector.py

Capabilities:
  notes.create  create a note; idempotent by idempotency key (a retry with
                the same key returns the original note); optional delay_ms
                (cancellable, before the write) and hold_ms (after it)
  notes.get     read one note
  notes.list    list the notes
  notes.export  streaming: one data chunk per note, then the count;
                optional delay_ms between chunks (cancellable)

Events: each created note is published as a note.created event on the
channel notes.changes through the sidecar (publish_events, POST
/sidecar/events with AIP_SIDECAR_EVENTS_URL and AIP_SIDECAR_EVENTS_TOKEN,
which aip-sidecar --exec sets). The event ID is derived from the action ID,
so a retried publication is stored once. The example publishes after the
note's write and gives up after a few attempts; a production service would
keep unpublished events in its journal and publish them again.

Everything the service knows lives in one JSON journal file written
atomically (temporary file, fsync, rename, fsync of the directory): the
notes, every action's record, and the idempotency keys. A note and the
completion of the action that created it are written in the same atomic
write, so after a crash an action journaled as running provably did not
create its note; POST /aip/reconcile answers from this journal.

Configuration (flags win over the environment the sidecar sets):
  --listen URL      AIP_SIDECAR_LOCAL_URL      e.g. http://127.0.0.1:8700
  --socket PATH     AIP_SIDECAR_LOCAL_SOCKET   a unix socket instead
  --state FILE      NOTES_STATE                the journal (default ./notes-journal.json)
  --token-file F    AIP_SIDECAR_LOCAL_TOKEN    bearer token the sidecar sends
  --signal-log F    NOTES_SIGNAL_LOG           append one JSON line per SIGTERM/SIGINT
  --maintenance-file F  NOTES_MAINTENANCE_FILE  while F exists, /aip/health reports
                    unavailable (the replica goes offline until F is removed)
"""

import argparse
import hmac
import json
import os
import signal
import socketserver
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

MAX_BODY = 8 << 20
NDJSON = "application/x-ndjson"

_NOTE = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "title": {"type": "string"},
        "body": {"type": "string"},
        "created_at": {"type": "string"},
    },
    "required": ["id", "title", "body", "created_at"],
}


def _contract(effects, retry, streaming=False, cancel=False, idempotency="optional"):
    return {
        "side_effects": effects,
        "idempotency": {
            "requirement": idempotency,
            "collision_behavior": "return_original_result",
            "key_scope": "capability",
        },
        "execution": {
            "supports_sync": True,
            "supports_async": False,
            "supports_streaming": streaming,
            "supports_cancel": cancel,
            "supports_retry": True,
            "expected_completion": "any" if streaming else "sync",
            "retry_safety": retry,
        },
        "data": {"sensitivity": "internal", "contains_pii": False, "redaction_required": False},
    }


CHANNEL = "notes.changes"

MANIFEST = {
    "manifest_version": "aip-manifest/v1",
    "agent": {"id": "agent:notes-example", "kind": "agent", "display_name": "Notes (Python example)"},
    "profiles": ["aip.native.http.v1"],
    "channels": [{"id": CHANNEL}],
    "capabilities": [
        {
            "id": "notes.create",
            "name": "Create a note",
            "kind": "tool",
            "description": "Creates a note. A retry with the same idempotency key returns the original note.",
            "input_schema": {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "minLength": 1, "maxLength": 200},
                    "body": {"type": "string", "maxLength": 65536},
                    "delay_ms": {"type": "integer", "minimum": 0, "maximum": 600000},
                    "hold_ms": {"type": "integer", "minimum": 0, "maximum": 600000},
                },
                "required": ["title"],
                "additionalProperties": False,
            },
            "output_schema": {
                "type": "object",
                "properties": {"note": _NOTE, "reconciled": {"type": "boolean"}},
                "required": ["note"],
            },
            "risk": "low",
            "stability": "stable",
            "contract": _contract(["write"], "safe_with_idempotency_key", cancel=True, idempotency="required"),
        },
        {
            "id": "notes.get",
            "name": "Read a note",
            "kind": "tool",
            "input_schema": {
                "type": "object",
                "properties": {"id": {"type": "string", "minLength": 1}},
                "required": ["id"],
                "additionalProperties": False,
            },
            "output_schema": {"type": "object", "properties": {"note": _NOTE}, "required": ["note"]},
            "risk": "low",
            "stability": "stable",
            "contract": _contract(["read"], "safe"),
        },
        {
            "id": "notes.list",
            "name": "List notes",
            "kind": "tool",
            "input_schema": {"type": "object", "additionalProperties": False},
            "output_schema": {
                "type": "object",
                "properties": {"notes": {"type": "array", "items": _NOTE}},
                "required": ["notes"],
            },
            "risk": "low",
            "stability": "stable",
            "contract": _contract(["read"], "safe"),
        },
        {
            "id": "notes.export",
            "name": "Export notes as a stream",
            "kind": "tool",
            "description": "Streams one data chunk per note, then returns the count.",
            "input_schema": {
                "type": "object",
                "properties": {"delay_ms": {"type": "integer", "minimum": 0, "maximum": 600000}},
                "additionalProperties": False,
            },
            "output_schema": {
                "type": "object",
                "properties": {"count": {"type": "integer", "minimum": 0}},
                "required": ["count"],
            },
            "risk": "low",
            "stability": "stable",
            "contract": _contract(["read"], "safe", streaming=True, cancel=True),
        },
    ],
}


def publish_events(channel_id, events, attempts=3, url=None, token=None):
    """Posts a batch of events to the sidecar (POST /sidecar/events) and
    returns its batch ID. Each event needs a stable "id" (evt_ + a UUIDv7 in
    32 hex digits) and "occurred_at", the same on every retry: the sidecar
    answers a retried batch with the same batch ID and the fleet's event log
    stores an event ID once. A 503 (the replica does not take events now)
    is retried after its Retry-After; a 4xx raises at once (its message
    says what to fix)."""
    url = url or os.environ.get("AIP_SIDECAR_EVENTS_URL", "")
    token = token or os.environ.get("AIP_SIDECAR_EVENTS_TOKEN", "")
    if not url or not token:
        raise RuntimeError("no AIP_SIDECAR_EVENTS_URL/AIP_SIDECAR_EVENTS_TOKEN: run under aip-sidecar --exec")
    body = json.dumps({"channel_id": channel_id, "events": events}).encode("utf-8")
    for attempt in range(attempts):
        req = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "Authorization": "Bearer " + token})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read())["batch_id"]
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")
            if e.code != 503 or attempt == attempts - 1:
                raise RuntimeError("POST %s: HTTP %d %s" % (url, e.code, detail))
            time.sleep(min(float(e.headers.get("Retry-After") or 1), 5))
        except OSError:
            if attempt == attempts - 1:
                raise
            time.sleep(1)


def now():
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % (int(t * 1000) % 1000)


class Journal:
    """The service's durable state: one JSON file replaced atomically."""

    def __init__(self, path):
        self.path = os.path.abspath(path)
        self.lock = threading.Lock()
        self.data = {"notes": {}, "actions": {}, "keys": {}}
        if os.path.exists(self.path):
            with open(self.path, "r", encoding="utf-8") as f:
                self.data = json.load(f)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)

    def save(self):
        """Writes the state: temporary file, fsync, rename, fsync of the
        directory. Callers hold self.lock."""
        d = os.path.dirname(self.path)
        fd, tmp = tempfile.mkstemp(prefix=".notes-", dir=d)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.data, f, separators=(",", ":"), sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class Service:
    def __init__(self, journal):
        self.journal = journal
        self.running = {}  # action_id -> threading.Event (set = cancel requested)
        self.finished = {}  # action_id -> threading.Event (set = done)
        self.running_lock = threading.Lock()

    def done_event(self, action_id):
        """The event set when action_id, running in this process, ends; None
        when it is not running here (a record left by a previous process)."""
        with self.running_lock:
            return self.finished.get(action_id)

    # -- actions ---------------------------------------------------------

    def act(self, req, stream):
        """Runs one action. stream(chunk) sends a chunk (None in sync mode).
        Returns a result object."""
        cap = req["capability_id"]
        handler = {
            "notes.create": self.create,
            "notes.get": self.get,
            "notes.list": self.list,
            "notes.export": self.export,
        }.get(cap)
        if handler is None:
            raise HTTPError(404, "notes.unknown_capability", "unknown capability " + cap)
        inp = req.get("input")
        if not isinstance(inp, dict):
            return failed("notes.invalid_input", "input must be an object")
        cancel, done = threading.Event(), threading.Event()
        with self.running_lock:
            if req["action_id"] in self.running:
                raise HTTPError(409, "notes.in_progress", "action %s is already running" % req["action_id"])
            self.running[req["action_id"]] = cancel
            self.finished[req["action_id"]] = done
        try:
            return handler(req, inp, cancel, stream)
        finally:
            with self.running_lock:
                self.running.pop(req["action_id"], None)
                self.finished.pop(req["action_id"], None)
            done.set()

    def create(self, req, inp, cancel, stream):
        j = self.journal
        aid, key = req["action_id"], req["idempotency_key"]
        title = inp.get("title")
        if not isinstance(title, str) or not title:
            return failed("notes.invalid_input", "title must be a non-empty string")
        while True:
            with j.lock:
                rec = j.data["actions"].get(aid)
                if rec and rec["status"] != "running":
                    return rec["result"]
                prev = j.data["keys"].get(key)
                prec = j.data["actions"].get(prev) if prev and prev != aid else None
                if prec and prec["status"] == "completed":
                    # Idempotent create: the original result.
                    return prec["result"]
                busy = self.done_event(prev) if prec and prec["status"] == "running" else None
                if busy is None:
                    # Journal the action (and claim the key) before its effect.
                    j.data["actions"][aid] = {
                        "action_id": aid,
                        "idempotency_key": key,
                        "capability_id": req["capability_id"],
                        "status": "running",
                        "received_at": now(),
                    }
                    j.data["keys"][key] = aid
                    j.save()
                    break
            busy.wait()  # another action with this key runs here: wait for its outcome
        if cancel.wait(inp.get("delay_ms", 0) / 1000.0):
            result = {"status": "cancelled"}
            with j.lock:
                j.data["actions"][aid].update(status="cancelled", result=result)
                j.save()
            return result
        note = {"id": "note_" + uuid.uuid4().hex, "title": title, "body": inp.get("body", ""), "created_at": now()}
        result = {"status": "completed", "output": {"note": note}, "message": [{"type": "text", "text": "Created note " + note["id"]}]}
        with j.lock:
            # The note, the action's completion and the key: one atomic write.
            j.data["notes"][note["id"]] = note
            j.data["actions"][aid].update(status="completed", result=result)
            j.save()
        log("created", note["id"], "action", aid)
        if os.environ.get("AIP_SIDECAR_EVENTS_URL"):
            # The event ID is the action's UUIDv7: the same on every retry.
            event = {"id": "evt_" + aid[len("act_"):], "kind": "note.created", "occurred_at": note["created_at"],
                     "action_id": aid, "data": {"note_id": note["id"], "title": note["title"]}}
            try:
                log("published", event["id"], "batch", publish_events(CHANNEL, [event]))
            except Exception as e:  # the note exists; the event is lost (see the module's doc)
                log("event", event["id"], "not published:", e)
        hold = inp.get("hold_ms", 0)
        if hold:
            time.sleep(hold / 1000.0)  # a slow answer after the effect
        return result

    def get(self, req, inp, cancel, stream):
        with self.journal.lock:
            note = self.journal.data["notes"].get(inp.get("id"))
        if note is None:
            return failed("notes.not_found", "no note %s" % inp.get("id"))
        return {"status": "completed", "output": {"note": note}}

    def list(self, req, inp, cancel, stream):
        with self.journal.lock:
            notes = sorted(self.journal.data["notes"].values(), key=lambda n: (n["created_at"], n["id"]))
        return {"status": "completed", "output": {"notes": notes}}

    def export(self, req, inp, cancel, stream):
        with self.journal.lock:
            notes = sorted(self.journal.data["notes"].values(), key=lambda n: (n["created_at"], n["id"]))
        delay = inp.get("delay_ms", 0) / 1000.0
        for i, note in enumerate(notes):
            if i > 0 and cancel.wait(delay):
                return {"status": "cancelled"}
            if cancel.is_set():
                return {"status": "cancelled"}
            if stream is not None:
                stream({"kind": "data", "data": note})
        return {"status": "completed", "output": {"count": len(notes)}}

    def cancel(self, action_id):
        with self.running_lock:
            ev = self.running.get(action_id)
        if ev is None:
            return False
        ev.set()
        return True

    def reconcile(self, req):
        """What became of an action the sidecar lost track of."""
        aid = req["action_id"]
        with self.running_lock:
            if aid in self.running:
                return {"status": "running"}
        with self.journal.lock:
            rec = self.journal.data["actions"].get(aid)
        if rec is None:
            return {"status": "not_found", "detail": "the notes service has no record of this action"}
        if rec["status"] == "running":
            # Not running in this process, and the effect is written
            # atomically with the completion: it never happened.
            return failed("notes.not_executed", "the notes service stopped before this action's write; no note was created")
        result = dict(rec["result"])
        if result.get("status") == "completed" and isinstance(result.get("output"), dict):
            result["output"] = dict(result["output"], reconciled=True)
        return result


def failed(code, message):
    return {"status": "failed", "error": {"code": code, "message": message, "category": "permanent", "retryable": False}}


class HTTPError(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def log(*parts):
    print("notes:", *parts, file=sys.stderr, flush=True)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "notes-connector/1"

    # Set on the class by main().
    service = None
    token = None
    maintenance = None

    def address_string(self):
        return self.client_address[0] if self.client_address else "unix"

    def log_message(self, fmt, *args):
        pass  # one line per request is too chatty for an example

    def send_json(self, status, obj):
        raw = json.dumps(obj, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def send_error_json(self, status, code, message):
        self.send_json(status, {"error": {"code": code, "message": message, "category": "permanent", "retryable": False}})

    def authorized(self):
        if not self.token:
            return True
        got = self.headers.get("Authorization", "")
        if hmac.compare_digest(got.encode(), ("Bearer " + self.token).encode()):
            return True
        self.send_error_json(401, "notes.unauthorized", "missing or wrong bearer token")
        return False

    def read_json(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise HTTPError(413, "notes.too_large", "the body exceeds %d bytes" % MAX_BODY)
        try:
            return json.loads(self.rfile.read(n) or b"null")
        except ValueError as e:
            raise HTTPError(400, "notes.bad_json", str(e))

    def do_GET(self):
        if not self.authorized():
            return
        if self.path == "/aip/manifest":
            self.send_json(200, MANIFEST)
        elif self.path == "/aip/health":
            if self.maintenance and os.path.exists(self.maintenance):
                self.send_json(503, {"status": "unavailable", "detail": "maintenance: %s exists" % self.maintenance})
            else:
                self.send_json(200, {"status": "ok"})
        else:
            self.send_error_json(404, "notes.not_found", "no route " + self.path)

    def do_POST(self):
        if not self.authorized():
            return
        try:
            if self.path == "/aip/actions":
                self.action(self.read_json())
            elif self.path == "/aip/reconcile":
                self.send_json(200, self.service.reconcile(self.read_json()))
            elif self.path.startswith("/aip/actions/") and self.path.endswith("/cancel"):
                aid = self.path[len("/aip/actions/"):-len("/cancel")]
                self.read_json()
                if self.service.cancel(aid):
                    self.send_json(200, {"status": "cancelling"})
                else:
                    self.send_json(404, {"status": "not_running"})
            else:
                self.send_error_json(404, "notes.not_found", "no route " + self.path)
        except HTTPError as e:
            self.send_error_json(e.status, e.code, e.message)

    def action(self, req):
        if not isinstance(req, dict) or not req.get("action_id") or not req.get("idempotency_key"):
            raise HTTPError(400, "notes.bad_request", "action_id and idempotency_key are required")
        if req.get("mode") != "streaming":
            self.send_json(200, self.service.act(req, None))
            return
        started = []

        def write_line(obj):
            if not started:
                self.send_response(200)
                self.send_header("Content-Type", NDJSON)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                started.append(True)
            raw = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
            self.wfile.flush()

        result = self.service.act(req, lambda chunk: write_line({"chunk": chunk}))
        write_line({"result": result})
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class TCPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def server_bind(self):
        try:
            os.unlink(self.server_address)
        except FileNotFoundError:
            pass
        old = os.umask(0o177)  # the socket is the owner's only
        try:
            socketserver.UnixStreamServer.server_bind(self)
        finally:
            os.umask(old)


def main(argv=None):
    p = argparse.ArgumentParser(description="Notes service for the aipfleet sidecar local contract.")
    p.add_argument("--listen", default=os.environ.get("AIP_SIDECAR_LOCAL_URL", ""))
    p.add_argument("--socket", default=os.environ.get("AIP_SIDECAR_LOCAL_SOCKET", ""))
    p.add_argument("--state", default=os.environ.get("NOTES_STATE", "notes-journal.json"))
    p.add_argument("--token-file", default="")
    p.add_argument("--signal-log", default=os.environ.get("NOTES_SIGNAL_LOG", ""))
    p.add_argument("--maintenance-file", default=os.environ.get("NOTES_MAINTENANCE_FILE", ""))
    args = p.parse_args(argv)

    token = os.environ.get("AIP_SIDECAR_LOCAL_TOKEN", "")
    if args.token_file:
        with open(args.token_file, "r", encoding="utf-8") as f:
            token = f.read().strip()
    Handler.service = Service(Journal(args.state))
    Handler.token = token
    Handler.maintenance = args.maintenance_file

    if args.socket:
        server = UnixServer(args.socket, Handler)
        where = "unix:" + args.socket
    elif args.listen:
        u = urlparse(args.listen)
        if u.scheme != "http" or not u.port:
            p.error("--listen wants http://HOST:PORT")
        server = TCPServer((u.hostname, u.port), Handler)
        where = args.listen
    else:
        p.error("give --listen or --socket (or run under aip-sidecar --exec, which sets them)")

    def on_signal(signum, frame):
        if args.signal_log:
            with open(args.signal_log, "a", encoding="utf-8") as f:
                f.write(json.dumps({"signal": signal.Signals(signum).name, "time_unix_ns": time.time_ns(), "pid": os.getpid()}) + "\n")
                f.flush()
                os.fsync(f.fileno())
        log("received", signal.Signals(signum).name, "- shutting down")
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log("serving on", where, "pid", os.getpid(), "journal", Handler.service.journal.path)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        if args.socket:
            try:
                os.unlink(args.socket)
            except FileNotFoundError:
                pass
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
