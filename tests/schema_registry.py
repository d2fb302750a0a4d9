"""A small Schema Registry for the tests: Confluent's REST API as far as confluent_kafka's
SchemaRegistryClient, AvroSerializer and AvroDeserializer use it, keeping its state only in a
Kafka topic in Confluent's own `_schemas` record format.

No real registry can be run here (docs/metadata.md, "Schemas"), so this one stands in, built
the way Confluent's is: every change is a record appended to the topic's single partition, and
what the registry serves is what a reader thread has applied of that log, from its first record.

- keys are JSON: {"keytype":"SCHEMA","subject":S,"version":V,"magic":1},
  {"keytype":"DELETE_SUBJECT","subject":S,"magic":0}, {"keytype":"NOOP","magic":0};
- a SCHEMA value is {"subject","version","id","schema","deleted"}; a version soft-deleted is the
  same key again with deleted true; a hard delete is a tombstone (a null value) for that key;
- a DELETE_SUBJECT value is {"subject","version"}: every version up to it soft-deleted;
- a NOOP (null value) is written when the registry starts, to learn where the log ends (as
  Confluent's KafkaStore does), and by `noop()`;
- ids are assigned in the log's order: one more than the highest id read so far; a schema
  already registered under any subject keeps its id.

`read_only`: the registry writes nothing (not even its NOOP) and refuses registrations, like a
Confluent registry in READONLY mode on the low side: it reads the given topic on the given
cluster, and `start()` returns once it has read to the topic's end.
"""

import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
QUIET = 1.0  # s: nothing more after the partition's end: the log is read to its end


def key_bytes(key: dict) -> bytes:
    return json.dumps(key, separators=(",", ":")).encode()


def schema_key(subject: str, version: int) -> bytes:
    return key_bytes({"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1})


NOOP_KEY = key_bytes({"keytype": "NOOP", "magic": 0})


class RegistryError(Exception):
    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def canonical(schema: str) -> str:
    """A schema's text with the whitespace of its JSON left out (two registrations of the same
    schema are one)."""
    try:
        return json.dumps(json.loads(schema), separators=(",", ":"))
    except ValueError:
        return schema


class State:
    """What the log says: every version's value (soft-deleted ones too), the highest id."""

    def __init__(self):
        self.versions: dict = {}  # (subject, version) -> SCHEMA value (a dict)
        self.max_id = 0
        self.offset = -1          # the last offset applied

    def apply(self, key: bytes, value: bytes | None, offset: int) -> None:
        k = json.loads(key)
        kind = k.get("keytype")
        if kind == "SCHEMA":
            where = (k["subject"], k["version"])
            if value is None:
                self.versions.pop(where, None)  # a hard delete
            else:
                v = json.loads(value)
                self.versions[where] = v
                self.max_id = max(self.max_id, v["id"])
        elif kind == "DELETE_SUBJECT" and value is not None:
            v = json.loads(value)
            for (subject, version), sv in self.versions.items():
                if subject == v["subject"] and version <= v["version"]:
                    sv["deleted"] = True
        # NOOP, CONFIG, MODE and the rest: nothing served here depends on them
        self.offset = offset

    def of(self, subject: str, deleted: bool = False) -> list:
        return sorted((sv for (s, _), sv in self.versions.items()
                       if s == subject and (deleted or not sv.get("deleted"))),
                      key=lambda sv: sv["version"])

    def subjects(self, deleted: bool = False) -> list:
        return sorted({s for (s, _), sv in self.versions.items()
                       if deleted or not sv.get("deleted")})

    def by_id(self, schema_id: int) -> list:
        return sorted((sv for sv in self.versions.values() if sv["id"] == schema_id),
                      key=lambda sv: (sv["subject"], sv["version"]))


class SchemaRegistry:
    def __init__(self, bootstrap: str, topic: str = "_schemas", read_only: bool = False):
        self.bootstrap, self.topic, self.read_only = bootstrap, topic, read_only
        self.state = State()
        self.applied = threading.Condition()
        self.eof_at = None       # when the reader last reached the partition's end
        self.write_lock = threading.RLock()  # one writer, as a registry's leader is
        self.producer = None
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, name="registry-reader", daemon=True)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    # -- life --------------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> "SchemaRegistry":
        if not self.read_only:
            self._create_topic()
            self.producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all",
                                      "enable.idempotence": True, "linger.ms": 0})
        self._reader.start()
        if self.read_only:
            self._read_to_end(timeout)
        else:
            self.noop()  # (where the log ends: once it is read back, the state is whole)
        self._http.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._stop.set()
        self._reader.join(5)
        if self.producer is not None:
            self.producer.flush(5)
            self.producer = None

    def _create_topic(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        future = admin.create_topics([NewTopic(self.topic, 1, config={
            "cleanup.policy": "compact"})])[self.topic]
        try:
            future.result(30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise

    def _read_to_end(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.applied:
            while not (self.eof_at and time.monotonic() - self.eof_at >= QUIET):
                if time.monotonic() > deadline:
                    raise AssertionError(f"the registry did not read {self.topic} to its end")
                self.applied.wait(0.1)

    def _read(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"registry-{uuid.uuid4()}",
                      "enable.auto.commit": False, "enable.partition.eof": True})
        try:
            while not self._stop.is_set():
                md = c.list_topics(self.topic, timeout=5).topics.get(self.topic)
                if md is not None and md.error is None and md.partitions:
                    break
                time.sleep(0.2)
            c.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            while not self._stop.is_set():
                msgs = c.consume(100, timeout=0.1)
                with self.applied:
                    for m in msgs:
                        if m.error() is None:
                            self.state.apply(m.key(), m.value(), m.offset())
                            self.eof_at = None
                        elif m.error().code() == KafkaError._PARTITION_EOF:
                            self.eof_at = self.eof_at or time.monotonic()
                    self.applied.notify_all()
        finally:
            c.close()

    # -- writing: a record, then wait until the reader has applied it ------------------------

    def _write(self, key: bytes, value: dict | None, timeout: float = 30.0) -> None:
        if self.read_only:
            raise RegistryError(422, 42205, "the registry is in READONLY mode")
        written = []

        def delivered(err, msg):
            written.append(err or msg.offset())
        with self.write_lock:
            self.producer.produce(self.topic, None if value is None else key_bytes(value), key,
                                  partition=0, on_delivery=delivered)
            self.producer.flush(timeout)
            if not written or isinstance(written[0], KafkaError):
                raise RegistryError(500, 50001, f"not written to {self.topic}: {written}")
            deadline = time.monotonic() + timeout
            with self.applied:
                while self.state.offset < written[0]:
                    if time.monotonic() > deadline:
                        raise RegistryError(500, 50002, "the log was not read back in time")
                    self.applied.wait(0.1)

    def noop(self) -> None:
        self._write(NOOP_KEY, None)

    # -- the REST API ------------------------------------------------------------------------

    def register(self, subject: str, body: dict) -> dict:
        if self.read_only:
            raise RegistryError(422, 42205, f"Subject {subject} is in read-only mode")
        if body.get("schemaType", "AVRO") != "AVRO" or body.get("references"):
            raise RegistryError(422, 42201, "only Avro schemas without references here")
        text = body["schema"]
        with self.write_lock:  # (one registration at a time: the ids follow the log)
            with self.applied:
                same = [sv for sv in self.state.versions.values()
                        if canonical(sv["schema"]) == canonical(text)]
                mine = [sv for sv in same if sv["subject"] == subject and not sv.get("deleted")]
                if mine:
                    return {"id": mine[0]["id"]}
                schema_id = same[0]["id"] if same else self.state.max_id + 1
                version = 1 + max((v for s, v in self.state.versions if s == subject),
                                  default=0)
            self._write(schema_key(subject, version), {
                "subject": subject, "version": version, "id": schema_id, "schema": text,
                "deleted": False})
        return {"id": schema_id}

    def delete_version(self, subject: str, version: int, permanent: bool) -> int:
        with self.applied:
            sv = self.state.versions.get((subject, version))
        if sv is None:
            raise RegistryError(404, 40402, f"Version {version} not found.")
        if permanent:
            if not sv.get("deleted"):
                raise RegistryError(404, 40407, f"Subject '{subject}' Version {version} was "
                                    "not deleted first before being permanently deleted")
            self._write(schema_key(subject, version), None)
        elif sv.get("deleted"):
            raise RegistryError(404, 40406, f"Subject '{subject}' Version {version} was soft "
                                "deleted. Set permanent=true to delete permanently")
        else:
            self._write(schema_key(subject, version), {**sv, "deleted": True})
        return version

    def delete_subject(self, subject: str, permanent: bool) -> list:
        with self.applied:
            versions = self.state.of(subject, deleted=True)
        if not versions:
            raise RegistryError(404, 40401, f"Subject '{subject}' not found.")
        if permanent:
            if any(not sv.get("deleted") for sv in versions):
                raise RegistryError(404, 40405, f"Subject '{subject}' was not deleted first "
                                    "before being permanently deleted")
            for sv in versions:
                self._write(schema_key(subject, sv["version"]), None)
        else:
            self._write(key_bytes({"keytype": "DELETE_SUBJECT", "subject": subject,
                                   "magic": 0}),
                        {"subject": subject, "version": versions[-1]["version"]})
        return [sv["version"] for sv in versions]

    def get(self, path: list, query: dict):
        deleted = query.get("deleted", ["false"])[0] == "true"
        with self.applied:
            st = self.state
            if path == ["subjects"]:
                return st.subjects(deleted)
            if path[:2] == ["schemas", "ids"] and len(path) >= 3:
                found = st.by_id(int(path[2]))
                if not found:
                    raise RegistryError(404, 40403, "Schema not found")
                if path[3:] == ["versions"]:
                    return [{"subject": sv["subject"], "version": sv["version"]}
                            for sv in found if deleted or not sv.get("deleted")]
                if path[3:] == ["subjects"]:
                    return sorted({sv["subject"] for sv in found
                                   if deleted or not sv.get("deleted")})
                return {"schema": found[0]["schema"]}
            if path[0] == "subjects" and len(path) >= 3 and path[2] == "versions":
                versions = st.of(path[1], deleted)
                if not versions and not st.of(path[1], True):
                    raise RegistryError(404, 40401, f"Subject '{path[1]}' not found.")
                if len(path) == 3:
                    return [sv["version"] for sv in versions]
                if path[3] == "latest":
                    if not versions:
                        raise RegistryError(404, 40402, "Version latest not found.")
                    sv = versions[-1]
                else:
                    sv = next((sv for sv in versions if sv["version"] == int(path[3])), None)
                    if sv is None:
                        raise RegistryError(404, 40402, f"Version {path[3]} not found.")
                return {k: sv[k] for k in ("subject", "version", "id", "schema")}
            if path == ["config"]:
                return {"compatibilityLevel": "BACKWARD"}
            if path == ["mode"]:
                return {"mode": "READONLY" if self.read_only else "READWRITE"}
        raise RegistryError(404, 404, f"no such resource: /{'/'.join(path)}")

    def lookup(self, subject: str, body: dict, deleted: bool) -> dict:
        with self.applied:
            for sv in self.state.of(subject, deleted):
                if canonical(sv["schema"]) == canonical(body["schema"]):
                    return {k: sv[k] for k in ("subject", "version", "id", "schema")}
            if not self.state.of(subject, True):
                raise RegistryError(404, 40401, f"Subject '{subject}' not found.")
        raise RegistryError(404, 40403, "Schema not found")


def _handler(registry: SchemaRegistry):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass  # (quiet: the tests' output is the launch's)

        def _answer(self, work) -> None:
            try:
                status, body = 200, work()
            except RegistryError as exc:
                status, body = exc.status, {"error_code": exc.code, "message": exc.message}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _parts(self):
            url = urlsplit(self.path)
            return [unquote(p) for p in url.path.strip("/").split("/")], parse_qs(url.query)

        def _body(self) -> dict:
            return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))
                              or b"{}")

        def do_GET(self):
            path, query = self._parts()
            self._answer(lambda: registry.get(path, query))

        def do_POST(self):
            path, query = self._parts()
            body = self._body()
            if len(path) == 3 and path[0] == "subjects" and path[2] == "versions":
                self._answer(lambda: registry.register(path[1], body))
            elif len(path) == 2 and path[0] == "subjects":
                self._answer(lambda: registry.lookup(
                    path[1], body, query.get("deleted", ["false"])[0].lower() == "true"))
            else:
                self._answer(self._unknown)

        def do_DELETE(self):
            path, query = self._parts()
            permanent = query.get("permanent", ["false"])[0].lower() == "true"
            if len(path) == 4 and path[0] == "subjects" and path[2] == "versions" and \
                    re.fullmatch(r"\d+", path[3]):
                self._answer(lambda: registry.delete_version(path[1], int(path[3]), permanent))
            elif len(path) == 2 and path[0] == "subjects":
                self._answer(lambda: registry.delete_subject(path[1], permanent))
            else:
                self._answer(self._unknown)

        def _unknown(self):
            raise RegistryError(404, 404, f"no such resource: {self.path}")

    return Handler
