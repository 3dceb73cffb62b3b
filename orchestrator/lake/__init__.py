"""The output side: storage URIs, the data-file layout of a version, manifests.

Nothing here talks to the source or the state store.
"""
