"""Provider content hashes, one small module each, tested against the vectors
the providers and well-known clients (rclone) publish.

- `dropbox`: Dropbox `content_hash` (SHA-256 over the SHA-256s of 4 MiB blocks).
- `quickxor`: OneDrive / Graph `quickXorHash` (160-bit XOR-shift, base64).
- `checksums`: MD5 (Google Drive `md5Checksum`) and Nextcloud `OC-Checksum`
  values (`SHA1:`, `MD5:`, `ADLER32:`).
"""

from .checksums import OcChecksum, OcChecksumError, md5_hex, oc_checksum, parse_oc_checksum
from .dropbox import DropboxContentHasher, dropbox_content_hash
from .quickxor import QuickXorHash, quickxor_base64

__all__ = [
    "DropboxContentHasher",
    "OcChecksum",
    "OcChecksumError",
    "QuickXorHash",
    "dropbox_content_hash",
    "md5_hex",
    "oc_checksum",
    "parse_oc_checksum",
    "quickxor_base64",
]
