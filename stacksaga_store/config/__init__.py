"""Configuration: the seed's properties (``settings``), the DataStax driver file (``hocon``,
``driver``) and the duration strings both accept (``durations``). Imports nothing of the store."""
