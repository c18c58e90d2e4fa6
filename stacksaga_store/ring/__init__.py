"""The ring coordinator: fenced token-range leases as values and a state machine (``leases``),
who may ask for them (``auth``), and the gRPC service that grants them (``server``)."""
