"""Which incarnation of a source partition records come from.

Offsets mean something only within one incarnation of a source partition: a topic deleted and
recreated, or a cluster rebuilt under the same topic names, starts again at offset 0. Kafka tells
incarnations apart by topic id (KIP-516: a random UUID given when a topic is created, never
reused), so diode does the same: every run crosses the link with its partition's incarnation,
16 bytes, and every state the receiver keeps for a partition (ordering, dedup, checkpoints, the
recovery from provenance headers) is kept per incarnation.

- With a topic id (Apache Kafka 2.8 and later, Tansu): the incarnation is the topic id. Ids are
  random 128-bit values, so they do not collide across clusters either; the cluster id travels
  in the heartbeats, for the operator.
- Without one (older brokers): a digest of the cluster id, the topic name and a creation mark
  the sender observed when it first read the topic (kept in its committed offsets' metadata, so a
  restarted sender keeps the same one). A recreation is then seen when a partition's end falls
  below what was read from it.

Text form: Kafka's (base64url without padding, 22 characters, as `kafka-topics --describe`
prints topic ids; librdkafka prints the same id with + and / for - and _), in provenance headers,
missing-range events, logs and `diode status`.
"""

import base64
import hashlib

NO_INCARNATION = bytes(16)  # the incarnation of a source partition no one could name

SIZE = 16
# The committed offsets' metadata: "diode incarnation=<text>[ mark=<creation mark>]"
METADATA_PREFIX = "diode incarnation="


def from_uuid(uuid) -> bytes:
    """A confluent_kafka Uuid as 16 bytes (NO_INCARNATION for None or the all-zero id that
    brokers without topic ids return)."""
    if uuid is None:
        return NO_INCARNATION
    raw = (uuid.get_most_significant_bits().to_bytes(8, "big", signed=True) +
           uuid.get_least_significant_bits().to_bytes(8, "big", signed=True))
    return raw


def text(incarnation: bytes) -> str:
    """Kafka's text form of a topic id: base64url of its 16 bytes, without padding."""
    return base64.urlsafe_b64encode(bytes(incarnation)).rstrip(b"=").decode()


def parse(value: str | bytes) -> bytes | None:
    """The 16 bytes of a text form; None when it is not one."""
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            return None
    if len(value) != 22:
        return None
    try:
        raw = base64.urlsafe_b64decode(value.replace("+", "-").replace("/", "_") + "==")
    except (ValueError, TypeError):
        return None
    return raw if len(raw) == SIZE else None


def fallback(cluster_id: str, topic: str, mark: str) -> bytes:
    """The incarnation of a topic whose broker gives no topic id: a digest of the cluster id,
    the topic and the creation mark the sender observed (its first partition's log start and the
    time it first read it). Never all zero."""
    digest = hashlib.blake2b(f"{cluster_id}\0{topic}\0{mark}".encode(), digest_size=SIZE,
                             person=b"diode-incarnate").digest()
    return digest if digest != NO_INCARNATION else b"\x01" + digest[1:]


def metadata(incarnation: bytes, mark: str = "") -> str:
    """What the sender commits with its offsets: the incarnation they belong to."""
    return METADATA_PREFIX + text(incarnation) + (f" mark={mark}" if mark else "")


def from_metadata(value: str | None) -> tuple[bytes | None, str]:
    """(incarnation, creation mark) of committed offsets' metadata; (None, "") when it names
    none (committed by something else, or by a broker that does not keep metadata)."""
    if not value or not value.startswith(METADATA_PREFIX):
        return None, ""
    first, _, rest = value[len(METADATA_PREFIX):].partition(" ")
    mark = rest[len("mark="):] if rest.startswith("mark=") else ""
    return parse(first), mark
