"""The link: what crosses the diode and how. Records as columnar runs (runs, records), filled
into datagrams (batching), compressed (codec), sealed with a session's AEAD key (crypto) in a
versioned envelope (wire), accepted once (replay), repaired by parity (fec), large records in
fragments (fragments), paced onto the wire (pacing); who reaches the receiver's socket: the
address it binds and the senders it admits (admission); what the kernel says of the socket
(udpstat), and a simulator of a hostile link (linksim). docs/wire-format.md."""
