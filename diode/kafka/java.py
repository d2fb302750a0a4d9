"""librdkafka's client settings in the terms of Kafka's Java client, which Spark's Kafka
connector takes (as `kafka.`-prefixed options): the settings that reach a cluster, translated
one way, so that a command given librdkafka's settings (diode.kafka.cluster) reads with either
Kafka source of `diode verify`.

The two clients name most connection settings alike (bootstrap.servers, security.protocol,
sasl.mechanism, client.id, ssl.keystore.*, ssl.key.password); the others differ:

- sasl.username and sasl.password are the Java client's sasl.jaas.config, with the login module
  of the mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512);
- ssl.ca.location (a PEM file) is a PEM trust store (ssl.truststore.type PEM,
  ssl.truststore.location), ssl.ca.pem its certificates; "probe" is the JVM's own trust store;
- ssl.certificate.location and ssl.key.location (PEM files), or ssl.certificate.pem and
  ssl.key.pem, are a PEM key store (ssl.keystore.certificate.chain, ssl.keystore.key: their
  text); ssl.keystore.location is PKCS#12, as librdkafka reads it;
- ssl.endpoint.identification.algorithm none is the Java client's empty value.

A connection setting with no Java counterpart (OAUTHBEARER's, Kerberos' kinit command, a CA
directory, ...) is refused, naming it (`Untranslatable`); librdkafka's own tuning (socket.*,
metadata.*, fetch sizes, ...) is left out and said (`notes`).
"""

import os

from diode.kafka.clients import CONNECTION_KEYS

SAME = {"bootstrap.servers", "client.id", "security.protocol", "sasl.mechanism",
        "sasl.kerberos.service.name", "ssl.keystore.location", "ssl.keystore.password",
        "ssl.key.password", "ssl.cipher.suites"}
LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                 "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                 "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
# librdkafka's, about how its own client connects: the Java client has its defaults for them
LIBRDKAFKA_ONLY = ("socket.", "metadata.", "topic.metadata.", "broker.address.family")


class Untranslatable(ValueError):
    """A librdkafka setting the Java client has no counterpart for (its key in `key`)."""

    def __init__(self, key: str, why: str):
        super().__init__(f"{key}: {why}")
        self.key = key


def java_settings(settings: dict) -> tuple[dict, list]:
    """(the Java client's settings for librdkafka's `settings`, notes on what was left out).
    Raises Untranslatable for a connection setting it has no counterpart for."""
    out, notes = {}, []
    s = dict(settings)
    if "sasl.mechanisms" in s:  # (librdkafka's older name)
        s.setdefault("sasl.mechanism", s.pop("sasl.mechanisms"))
    for key, value in s.items():
        if key in SAME:
            out[key] = str(value).upper() if key == "security.protocol" else str(value)
        elif key == "ssl.endpoint.identification.algorithm":
            out[key] = "" if str(value).lower() == "none" else str(value)
        elif key in ("sasl.username", "sasl.password"):
            continue  # (below: the JAAS configuration)
        elif key == "ssl.ca.location":
            if value == "probe":
                continue  # (the JVM's own trust store)
            if os.path.isdir(value):
                raise Untranslatable(key, "a directory of CA certificates: the Java client "
                                     "takes one PEM file of them")
            out.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": value})
        elif key == "ssl.ca.pem":
            out.update({"ssl.truststore.type": "PEM", "ssl.truststore.certificates": value})
        elif key in ("ssl.certificate.location", "ssl.key.location", "ssl.certificate.pem",
                     "ssl.key.pem"):
            out["ssl.keystore.type"] = "PEM"
            text = value if key.endswith(".pem") else _read(key, value)
            out["ssl.keystore.certificate.chain" if "certificate" in key
                else "ssl.keystore.key"] = text
        elif key.startswith(LIBRDKAFKA_ONLY) or not key.startswith(CONNECTION_KEYS):
            notes.append(key)
        else:
            raise Untranslatable(key, "librdkafka's, with no counterpart in Kafka's Java client")
    if "ssl.keystore.location" in out:
        out["ssl.keystore.type"] = "PKCS12"
    if "sasl.username" in s or "sasl.password" in s:
        out["sasl.jaas.config"] = jaas(s.get("sasl.mechanism", "GSSAPI"),
                                       s.get("sasl.username", ""), s.get("sasl.password", ""))
    return out, notes


def jaas(mechanism: str, username: str, password: str) -> str:
    """The Java client's sasl.jaas.config for a user and password of `mechanism`."""
    module = LOGIN_MODULES.get(str(mechanism).upper())
    if module is None:
        raise Untranslatable("sasl.mechanism", f"{mechanism} with sasl.username and "
                             "sasl.password: the Java client takes those for PLAIN and SCRAM")
    return f'{module} required username="{_quoted(username)}" password="{_quoted(password)}";'


def _quoted(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace('"', '\\"')


def _read(key: str, path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as exc:
        raise Untranslatable(key, f"cannot read {path}: {exc.strerror}") from None
