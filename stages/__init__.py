"""One module per stage type; the module name is the `type` in the topology.

Sender:   kafka_reader -> packer -> udp_sender  ~~UDP~~>
Receiver: udp_reader -> unpacker -> kafka_writer
"""
