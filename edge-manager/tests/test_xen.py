"""The `xen` backend where there is no Xen.

The end-to-end save through a Xen guest (and revoke → restore) is
`test_e2e.py`'s `xen` case; it runs the manager in dom0 of a Xen host
nested under QEMU (`testbed/xenhost.py`). The checks that need that host
(isolation, a guest that ends later, a state disk that does not mount, an
appliance that does not boot) share it, at the end of `test_e2e.py`.
"""

from __future__ import annotations

import subprocess

from testbed.edge import EDGE_BIN


def test_no_xen_is_a_clear_error_naming_what_is_missing(tmp_path):
    """This machine is no Xen dom0: a manager asked for xen refuses to
    start and says why, and what to do instead."""
    state = tmp_path / "state"
    out = subprocess.run([str(EDGE_BIN), "--state", str(state), "serve", "--runtime", "xen", "--runtimes", "xen",
                          "--no-isolation", "--operator-listen", "127.0.0.1:0", "--device-listen", "127.0.0.1:0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ec-edge: the xen runtime is not available on this host"), last
    assert "/proc/xen/capabilities" in last and "Xen control domain" in last and "microvm" in last, last
    assert out.stdout == ""  # no ready line: nothing listens


def test_xen_offered_besides_another_default_is_listed_as_missing(tmp_path):
    """With another default backend the manager starts, and its status page
    says why xen is not offered."""
    import json
    import urllib.request

    state = tmp_path / "state"
    proc = subprocess.Popen([str(EDGE_BIN), "--state", str(state), "serve", "--runtime", "process", "--runtimes", "process,xen",
                             "--no-isolation", "--operator-listen", "127.0.0.1:0", "--device-listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = json.loads(proc.stdout.readline())
        assert "process" in ready["runtimes"] and "xen" not in ready["runtimes"], ready
        token = (state / "operator.token").read_text().strip()
        req = urllib.request.Request(f"http://{ready['operator']}/", headers={"Authorization": f"Bearer {token}"})
        page = urllib.request.urlopen(req, timeout=30).read().decode()
        assert "xen" in page and "not a Xen control domain" in page, page[-2000:]
    finally:
        proc.terminate()
        proc.wait(10)
