"""Publish: each reconciled table becomes a new version — its files put in place (`staging`),
one Iceberg commit (`versions`), the manifest switched and old versions dropped (`switch`) — in
worker processes (`workers`); `step` is the step."""
