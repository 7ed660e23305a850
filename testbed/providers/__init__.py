"""Local provider test servers: Dropbox v2, Microsoft Graph / OneDrive, Google
Drive v3 and WebDAV / Nextcloud in one asyncio (aiohttp) process, dispatching on
the Host header, served over TLS with a certificate from a test CA for the
providers' real host names.

Run it with `python -m testbed.providers serve --help`. The pieces:

- `hashes`: provider content hashes.
- `store`: files on disk per provider and account, with revisions.
- `control`: injectable faults and the request log (the admin API's state).
- `tls`: the test CA and the server certificate (trustme).
- `dropbox`, `graph`, `drive`, `webdav`: one module per provider, routes only.
- `server`: the aiohttp application: host dispatch, faults, logging, admin API.
"""

from .server import ServerConfig, build_app

__all__ = ["ServerConfig", "build_app"]
