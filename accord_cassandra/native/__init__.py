"""The sidecar's CQL native-protocol endpoint: the frame codec (:mod:`.frame`), values
(:mod:`.values`), the light statement check (:mod:`.statements`) and the server
(:mod:`.endpoint`). docs/sidecars.md, "The CQL endpoint"."""
