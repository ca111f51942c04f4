"""Self-signed certificates made with openssl at test time (none is checked in)."""

import subprocess
from pathlib import Path


def self_signed(folder: Path, name: str, alt_names: str) -> tuple[Path, Path]:
    """(cert.pem, key.pem) in `folder`: CN `name`, subjectAltName `alt_names` (e.g. 'DNS:localhost,IP:127.0.0.1'),
    valid for two days."""
    cert, key = Path(folder) / 'cert.pem', Path(folder) / 'key.pem'
    subprocess.run(
        ['openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', str(key), '-out', str(cert)]
        + ['-days', '2', '-subj', f'/CN={name}', '-addext', f'subjectAltName={alt_names}'],
        check=True,
        capture_output=True,
    )
    return cert, key
