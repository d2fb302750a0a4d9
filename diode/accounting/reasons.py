"""Why a range of source offsets is reported missing, filled or closed: every reason, once.

A reason is the `reason` field of an event on receiver.missing.records.topic (the event types in
diode.kafka.messages) and the text in parentheses of the receiver's log line "missing t[p]
offsets a..b (MEANING)". The names below are the only spellings of them in the code: where a
missing range is decided (diode.accounting.ordering) picks GAP, TAIL, RECEIVER_DOWN or
SOURCE_RESET; the writer's reporter (diode.writer.reporter) adds EXPIRED, REFUSED and LATE, and
closes tickets FILLED, EXPIRED or UNTRACKED. REASONS says what each means, whether it opens a
resend ticket and what the operator does: docs/events.md is generated from it. Pure: no I/O.
"""

from typing import NamedTuple

GAP = "gap"                      # a later record arrived
TAIL = "tail"                    # a heartbeat said they were sent
RECEIVER_DOWN = "receiver-down"  # sent while no receiver was reading
SOURCE_RESET = "source-reset"    # a newer incarnation of the source partition replaced this one
EXPIRED = "expired"              # below the source's log start: never to be resent
REFUSED = "refused"              # written "refused: <error>": refused by the destination
LATE = "late"                    # a filled event: records of a reported range arrived
FILLED = "filled"                # a ticket closed: every record of its range arrived
UNTRACKED = "untracked"          # a ticket closed: too many open for the partition
TICKET_CLOSED = (FILLED, EXPIRED, UNTRACKED)  # how a resend ticket closes


class Reason(NamedTuple):
    name: str
    events: str         # the event types that carry it
    meaning: str        # also the receiver's log line: "missing t[p] offsets a..b (MEANING)"
    ticket: bool        # a resend ticket opens (diode tickets lists it)
    resendable: str     # whether `diode resend` can bring the records back
    action: str         # what the operator does


RESEND = "Resend it ([runbooks](runbooks.md#a-missing-range))"
REASONS = (
    Reason(GAP, "missing", "lost on the link", True, "yes, while the source holds it",
           f"{RESEND}. Many: look at the link ([troubleshooting]"
           "(troubleshooting.md#records-reported-missing)). A record larger than "
           "sender.max.record.bytes, in the sender's dead-letter topic, is reported so too: no "
           "resend brings it."),
    Reason(TAIL, "missing", "sent before the last heartbeat, never arrived", True,
           "yes, while the source holds it",
           f"{RESEND}. With a silent link: the link or the sender went down mid-stream."),
    Reason(RECEIVER_DOWN, "missing", "sent while no receiver was reading", True,
           "yes, while the source holds it",
           f"{RESEND}. Keep the receiver running whenever the sender is (start it first)."),
    Reason(SOURCE_RESET, "missing",
           "still missing when a new incarnation of the source partition replaced this one",
           True, "no: the topic was recreated (or its cluster rebuilt), the old records are "
           "gone", "None: the ticket closes expired at once, and the new topic is replicated "
           "from its first record. Find out who recreated the source topic."),
    Reason(EXPIRED, "missing, closed", "the source no longer holds them: they cannot be "
           "resent", False, "no: retention deleted them at the source",
           "None for these records. Resend at-risk ranges sooner "
           "(`diode_missing_at_risk_records`), or keep them longer at the source."),
    Reason(f"{REFUSED}: <error>", "missing", "the destination refused the record for good and "
           "there is no dead-letter topic, or that refused it too", False,
           "yes, once the destination takes it (it is no ticket: resend it from an audit's "
           "manifest)", "Fix the destination (the error says what: a size limit, an ACL), "
           "then [runbooks](runbooks.md#a-refused-record)."),
    Reason(LATE, "filled", "records of a reported range arrived after all (late, or resent)",
           False, "-", "None: a correction of the missing event."),
    Reason(FILLED, "closed", "every record of the ticket's range has arrived (or every record "
           "the source holds in it)", False, "-", "None."),
    Reason(UNTRACKED, "closed", "more than 10 000 tickets were open for the source "
           "partition: the oldest stops being tracked", False,
           "yes, while the source holds it (through an audit's manifest)",
           "Find why so much is lost ([troubleshooting](troubleshooting.md#records-reported-"
           "missing)); `diode verify --manifest` finds these ranges again."),
)
REASON_MEANINGS = {r.name: r.meaning for r in REASONS}


def refused(error: str) -> str:
    """The reason of a record the destination refused for good: "refused: <error>"."""
    return f"{REFUSED}: {error}"


def meaning(reason: str) -> str:
    """What a reason means, for the receiver's log line ("refused: <error>" says itself)."""
    return REASON_MEANINGS.get(reason, reason)
