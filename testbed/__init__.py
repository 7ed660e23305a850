"""EdgeCourier testbed: local stand-ins for the things our machines cannot reach.

`testbed.providers` serves Dropbox, Microsoft Graph / OneDrive, Google Drive
and WebDAV / Nextcloud under their real host names through a test CA, so the
EPS, the device proxy and rclone run the code they would run against the real
cloud. See testbed/README.md.
"""
