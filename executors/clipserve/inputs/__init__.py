"""What a document can carry and how its bytes are had: `data:` URIs (data_uris.py), and under the operator's
URI policy (uris.py) server-side files (local_files.py) and remote URLs (remote.py: resolved once, connected
to at the checked address, one deadline; addresses.py: which addresses are public or allow-listed).
It imports only the standard library: no models, no Jina.
"""
