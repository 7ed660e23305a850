"""ec_proxy: the EdgeCourier device proxy (a mitmproxy addon).

- `recognise`: which provider call an app request is (pure).
- `sessions`: upload sessions answered on the device and gathered (pure).
- `direct`: the provider's own request sequence, for the fallback path.
- `store`: the device's last-synced store (SQLite + content-addressed files).
- `decide`: patch or whole file, from the link's speed and round-trip time.
- `addon`: the mitmproxy hooks tying them to the EPS client (`ec_protocol`).
- `routing`: lab only, sends provider host names to local test servers.
- `cli`, `status`: the `ec-proxy` command.
"""
