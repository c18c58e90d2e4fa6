"""The event store on Cassandra: the asyncio CQL session (``cql``) and how it is opened
(``connect``), the seed's tables (``schema``) and the recovery engine's extra ones
(``extension_schema``), the transaction records (``model``, ``states``, ``events``) and
write protection (``protection``)."""
