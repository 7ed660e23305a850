"""The device proxy as an installable package (issue 11): the `ec-proxy` wheel is
built from this checkout the way `make wheel` and `pip install device-proxy/`
build it (pip, PEP 517, device-proxy/pyproject.toml and wheel_backend.py; cargo
reuses the workspace's target/ so only the binding is rebuilt at most), then
installed with pip into a fresh virtual environment that sees nothing of the
checkout, where `ec-proxy --help` runs and ec_patch, ec_protocol and ec_proxy are
the wheel's own copies. Dependencies (mitmproxy) come from PyPI through pip's
cache. Nothing here skips: a missing maturin, compiler or network fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVICE_PROXY = ROOT / "device-proxy"
PACKAGES = {"ec_proxy": DEVICE_PROXY / "ec_proxy", "ec_protocol": ROOT / "protocol" / "python" / "ec_protocol"}


def _run(cmd, *, timeout, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stdout[-4000:]}\n{p.stderr[-6000:]}"
    return p


def _sources(package: Path) -> dict[str, bytes]:
    """The package's files as the wheel names them (subpackages included, no byte code)."""
    return {p.relative_to(package.parent).as_posix(): p.read_bytes() for p in sorted(package.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built as `make wheel` builds it (but into a temporary folder)."""
    scripts = Path(sysconfig.get_path("scripts"))
    assert (scripts / "maturin").is_file(), f"maturin is not installed beside {sys.executable}: run `make setup`"
    out = tmp_path_factory.mktemp("wheels")
    env = dict(os.environ, PATH=f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}")
    start = time.monotonic()
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--progress-bar", "off",
          "-w", out, DEVICE_PROXY], cwd=ROOT, env=env, timeout=3600)
    wheels = sorted(out.glob("*.whl"))
    assert [w.name.split("-")[0] for w in wheels] == ["ec_proxy"], f"expected one ec_proxy wheel, got {wheels}"
    print(f"built {wheels[0].name} ({wheels[0].stat().st_size} bytes) in {time.monotonic() - start:.1f} s")
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> tuple[Path, dict]:
    """A fresh virtual environment (from the base interpreter, without the .venv's
    site-packages and so without its edgecourier.pth) with the wheel installed."""
    home = tmp_path_factory.mktemp("fresh")
    venv = home / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=home, timeout=300)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH")}
    here = Path(sysconfig.get_path("scripts"))
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != here]
    env.update(PATH=os.pathsep.join([str(venv / "bin"), *path]), PYTHONNOUSERSITE="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    _run([venv / "bin" / "python", "-m", "pip", "install", "--progress-bar", "off", wheel], cwd=home, env=env, timeout=1800)
    return venv, {"cwd": home, "env": env}


def test_the_wheel_holds_the_three_packages_and_the_command(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for package, folder in PACKAGES.items():
            sources = _sources(folder)
            assert sources, f"no files in {folder}"
            in_wheel = {n for n in names if n.startswith(f"{package}/")}
            assert in_wheel == set(sources), (f"{package}: missing from the wheel {sorted(set(sources) - in_wheel)}, "
                                              f"not in the checkout {sorted(in_wheel - set(sources))}")
            stale = [n for n, data in sources.items() if z.read(n) != data]
            assert not stale, f"{package}: the wheel's copies differ from the checkout: {stale}"
        native = [n for n in names if n.startswith("ec_patch/") and n.endswith(".so")]
        assert native == ["ec_patch/ec_patch.abi3.so"], f"the binding in the wheel: {sorted(n for n in names if n.startswith('ec_patch/'))}"
        assert "ec_patch/__init__.py" in names
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")], "byte code in the wheel"
        others = {n.split("/")[0] for n in names} - {"ec_proxy", "ec_protocol", "ec_patch"}
        assert all(n.endswith(".dist-info") for n in others), f"unexpected top-level entries: {others}"
        dist_info = others.pop()
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode()
        scripts = [[part.strip() for part in line.split("=", 1)] for line in entry_points.splitlines() if "=" in line]
        assert ["ec-proxy", "ec_proxy.cli:main"] in scripts, entry_points
        metadata = z.read(f"{dist_info}/METADATA").decode()
        requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
        assert any(r.replace(" ", "").startswith("mitmproxy>=11.0.2,<11.1") for r in requires), requires
        record = z.read(f"{dist_info}/RECORD").decode()
        recorded = {line.split(",")[0] for line in record.splitlines() if line}
        assert recorded == names, f"RECORD differs from the archive: {sorted(recorded ^ names)}"


def test_pip_install_into_a_fresh_venv_then_ec_proxy_help(venv):
    venv, kw = venv
    command = venv / "bin" / "ec-proxy"
    assert command.is_file(), f"pip install did not make {command}"
    p = _run([command, "--help"], timeout=120, **kw)
    assert p.stdout.startswith("usage: ec-proxy"), p.stdout
    for word in ("EdgeCourier device proxy", "run", "status", "join", "leave"):
        assert word in p.stdout, f"{word!r} not in `ec-proxy --help`:\n{p.stdout}"
    p = _run([command, "run", "--help"], timeout=120, **kw)
    assert "--edge" in p.stdout and "--secret" in p.stdout, p.stdout


def test_the_fresh_venv_imports_the_wheels_copies(venv):
    venv, kw = venv
    site = _run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                timeout=60, **kw).stdout.strip()
    assert Path(site).resolve().is_relative_to(venv.resolve()), site
    assert not (Path(site) / "edgecourier.pth").exists()
    probe = """if True:
        import json, sys
        import ec_patch, ec_protocol, ec_proxy
        import ec_proxy.addon  # the mitmproxy addon: mitmproxy, the binding and the protocol client
        base = b"The quick brown fox jumps over the lazy dog. " * 50
        new = base.replace(b"lazy", b"sleepy", 1)
        assert ec_patch.apply(base, ec_patch.diff(base, new)) == new
        print(json.dumps({"files": {m.__name__: m.__file__ for m in (ec_patch, ec_protocol, ec_proxy)},
                          "path": sys.path}))
    """
    out = json.loads(_run([venv / "bin" / "python", "-c", probe], timeout=300, **kw).stdout)
    for name, file in out["files"].items():
        assert Path(file).resolve().is_relative_to(Path(site).resolve()), f"{name} imported from {file}, not the venv"
    on_path = [p for p in out["path"] if p and Path(p).resolve().is_relative_to(ROOT)]
    assert not on_path, f"the fresh venv sees the checkout: {on_path}"
