"""The output side: storage URIs, the data-file layout of a version, manifests, the Iceberg
tables.

Nothing here talks to the source. The state store's database may hold the Iceberg catalog
(`iceberg`), which is the one thing the lake takes from `state`.

May import: orchestrator, errors, positions, services, schema, chunking, config, state.
"""
