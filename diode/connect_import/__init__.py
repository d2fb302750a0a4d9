"""`diode import-properties`: a topology from the Confluent Data Diode connector's configuration.

Confluent's *sink* connector runs on the high side and sends datagrams (diode's sender); its
*source* connector runs on the low side and receives them (diode's receiver). An operator moving
from the connector has their two .properties files (or the JSON a Connect REST API takes) and,
perhaps, the Connect workers' files. This package maps every property it can to a topology key
and lists every other one with the reason, so nothing changes behind the operator's back; the
password is never written into the topology, only into a file of its own.

In four rooms, in the order the command goes through them:
- `properties`: the files read (java.util.Properties, Connect REST JSON) and which connector
  each configures;
- `mapping`: each property to a topology key, or to the reason it has none (pure functions);
- `render`: the topology as YAML, with the notes and what was not mapped above it;
- `command`: `diode import-properties` itself: read, map, validate with the topology registry,
  write the password file and the topology, print. Bad input (an unreadable file, a malformed
  line, values the two sides disagree on) is a PropertiesError, exit 2.
"""
