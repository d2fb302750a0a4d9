"""When the kafka_writer gives a destination topic up (its records to the dead-letter topic):
a topic the cluster refuses for good at once, one it will not create after 60 s of answering,
and never for a cluster that cannot be reached (an outage is waited out, however long)."""

from confluent_kafka import KafkaError

from diode.writer.destination import TOPIC_GIVE_UP_SECONDS, topic_given_up, topic_trouble


def test_a_destination_cluster_down_for_minutes_never_gives_its_topic_up():
    trouble = None
    for now in range(0, 600, 5):  # ten minutes of "Broker transport failure"
        trouble = topic_trouble(trouble, float(now), KafkaError(KafkaError._TRANSPORT))
        assert not topic_given_up(trouble, now + 1.0)
    # back, and the cluster will not create it: the 60 s count from when it answered
    trouble = topic_trouble(trouble, 600.0, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    trouble = topic_trouble(trouble, 630.0, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    assert not topic_given_up(trouble, 640.0)
    assert topic_given_up(trouble, 600.0 + TOPIC_GIVE_UP_SECONDS)


def test_a_topic_the_cluster_refuses_for_good_is_given_up_at_once():
    trouble = topic_trouble(None, 0.0, KafkaError(KafkaError._TIMED_OUT))
    trouble = topic_trouble(trouble, 1.0, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    assert topic_given_up(trouble, 1.0)
